"""Wrote flat_v1_*.pt with the flat-parameter FSDP (sharded format 1) at commit d9fae22, for the
compatibility test; kept for the record (it no longer reproduces them: FSDP now writes format 2).

    git checkout d9fae22 && torchrun --standalone --nproc_per_node=2 tests/fsdp/data/make_flat_v1.py
"""
import sys, torch, torch.distributed as dist
sys.path.insert(0, ".")
from minidist.fsdp import FSDP
from tests.common import rank_slice
from tests.fsdp.helpers import WRAPS, loss_of, make_batches, make_model, make_opt
dist.init_process_group("gloo"); torch.set_num_threads(1)
model = FSDP(make_model("gpt"), wrap=WRAPS["gpt"])
opt = make_opt(model.parameters())
batches = make_batches("gpt")
def step(b):
    x, y = b; opt.zero_grad(); loss_of("gpt", model, rank_slice(x), rank_slice(y)).backward(); opt.step()
for b in batches[:2]:
    step(b)
sd = model.sharded_state_dict(opt)
full = model.full_state_dict(rank0_only=False)
step(batches[2])
after = model.full_state_dict(rank0_only=False)
r = dist.get_rank()
torch.save(sd, f"tests/fsdp/data/flat_v1_rank{r}.pt")
if r == 0:
    torch.save({"full": full, "after_next_step": after}, "tests/fsdp/data/flat_v1_expected.pt")
dist.destroy_process_group()

"""CUDA smoke check of the FSDP engine, run by hand on a GPU machine (not collected by pytest):

    PYTHONPATH=. python3 tests/fsdp/cuda_smoke.py

World 1 on NCCL: exercises CUDA storage resize, autograd hooks on the device threads, the
end-of-backward callback and mixed precision (bf16 compute copies shard -> full). With one
GPU no real all_gather runs (NCCL refuses two ranks on one device).
"""

import copy
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29611")
dist.init_process_group("nccl", rank=0, world_size=1)
torch.cuda.set_device(0)

from minidist.fsdp import FSDP  # noqa: E402
from minidist.models.gpt import GPT, Block, GPTConfig  # noqa: E402

cfg = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=256)
torch.manual_seed(0)
base = GPT(cfg).cuda()
x = torch.randint(0, 256, (8, 64), device="cuda")


def train(model, steps=3):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        logits, _ = model(x)
        F.cross_entropy(logits.float().reshape(-1, 256), x.roll(-1, 1).reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    torch.cuda.synchronize()


ref = copy.deepcopy(base)
train(ref)
for strategy in ("full_shard", "shard_grad_op", "no_shard"):
    for pd in (None, torch.bfloat16):
        f = FSDP(copy.deepcopy(base), wrap={Block}, sharding_strategy=strategy, param_dtype=pd,
                 reduce_dtype=torch.float32 if pd else None)
        train(f)
        sd = f.full_state_dict(rank0_only=False, cpu_offload=False)
        diff = max((sd[k] - v).abs().max().item() for k, v in ref.state_dict().items())
        live = sum(u.flat.is_allocated and not u.flat.aliased for u in f.units)
        print(f"{strategy:<14} param_dtype={pd}: max|fsdp - ref| = {diff:.2e}, unsharded units alive after step: {live}")
        assert diff < (1e-5 if pd is None else 5e-2), diff
        assert live == 0
print("cuda smoke OK")
dist.destroy_process_group()

"""CUDA / NCCL check of every engine, run by hand on a GPU machine (CI has none):

    torchrun --standalone --nproc_per_node=1 checks/cuda_check.py

World 1 on NCCL with one GPU (NCCL refuses two ranks on one device, so no real
multi-rank traffic): exercises device-side collectives through minidist.comm and
its trace, DDP's hooks and buckets on CUDA, ZeRO-1, and FSDP's storage resize,
hooks on the device threads, end-of-backward callback and mixed precision.
Each engine's parameters are compared with a plain single-GPU run.
"""

import copy

import torch
import torch.nn.functional as F

import minidist
from minidist import comm
from minidist.fsdp import FSDP
from minidist.models.gpt import GPT, Block, GPTConfig

topo = minidist.runtime.init()  # nccl on a GPU; gloo/CPU runs it too, to check the script itself
dev = topo.device
cfg = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=256)
torch.manual_seed(0)
base = GPT(cfg).to(dev)
x = torch.randint(0, 256, (8, 64), device=dev)


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def train(model, steps=3, opt=None):
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        logits, _ = model(x)
        F.cross_entropy(logits.float().reshape(-1, 256), x.roll(-1, 1).reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    sync()


def max_diff(sd):
    return max((sd[k].to(dev) - v).abs().max().item() for k, v in ref.state_dict().items())


ref = copy.deepcopy(base)
train(ref)

with comm.trace() as t:
    y = torch.ones(1 << 20, device=dev)
    comm.all_reduce(y, comm.ReduceOp.AVG)
    comm.all_gather(torch.empty(1 << 20, device=dev), y, async_op=True).wait()
    comm.reduce_scatter(torch.empty(1 << 20, device=dev), y, async_op=True).wait()
sync()
assert torch.all(y == 1) and len(t.records) == 3
print(f"comm on {dev} OK:", [r.op for r in t.records])

for hook in (None, minidist.ddp.comm_hooks.bf16_compress_hook):
    for view in (False, True):
        d = minidist.DDP(copy.deepcopy(base), bucket_cap_mb=1, gradient_as_bucket_view=view, comm_hook=hook)
        train(d)
        diff = max_diff(d.module.state_dict())
        print(f"DDP hook={getattr(hook, '__name__', None)} gradient_as_bucket_view={view}: max|ddp - ref| = {diff:.2e}")
        assert diff < (1e-5 if hook is None else 5e-2), diff

z = minidist.DDP(copy.deepcopy(base))
train(z, opt=minidist.ShardedOptimizer(z.parameters(), torch.optim.AdamW, lr=1e-3))
print(f"ZeRO-1: max|zero1 - ref| = {max_diff(z.module.state_dict()):.2e}")
assert max_diff(z.module.state_dict()) < 1e-5

for strategy in ("full_shard", "shard_grad_op", "no_shard"):
    for pd in (None, torch.bfloat16):
        f = FSDP(copy.deepcopy(base), wrap={Block}, sharding_strategy=strategy, param_dtype=pd,
                 reduce_dtype=torch.float32 if pd else None)
        train(f)
        sd = f.full_state_dict(rank0_only=False, cpu_offload=False)
        diff = max_diff(sd)
        live = sum(u.shards.is_allocated and not u.shards.aliased for u in f.units)
        print(f"FSDP {strategy:<14} param_dtype={pd}: max|fsdp - ref| = {diff:.2e}, unsharded units alive after step: {live}")
        assert diff < (1e-5 if pd is None else 5e-2), diff
        assert live == 0
print(f"check OK on {dev} ({topo.backend})")
minidist.runtime.shutdown()

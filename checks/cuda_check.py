"""CUDA / NCCL check of every engine, run by hand on a GPU machine (CI has none):

    torchrun --standalone --nproc_per_node=1 checks/cuda_check.py     # (checks/gpu.sh runs it)

World 1 on NCCL with one GPU (every rank gets the same batch, so any world size must match
the single-GPU run; checks/gpu.sh adds world 2 where two GPUs exist): exercises device-side
collectives through minidist.comm and its trace, DDP's hooks and buckets on CUDA (and its mixed precision), ZeRO-1/2
(in-place reduce_scatter and all_gather, overlap, bf16 masters),
and FSDP's CUDA path as FSDP2 runs it (minidist.fsdp.streams): copy-in and all_gather on
the all_gather stream, reduce_scatter on its own stream (and the replica all_reduce on a
third, hybrid_shard), each ordered by events; forward and backward never block the host
(torch.cuda sync debug mode "error" around them); storage resize, hooks on the device
threads, the end-of-backward callback, mixed precision and CPU offload (shards, gradients,
optimizer state in pinned host memory, gathered to the GPU). Each engine's parameters are
compared with a plain single-GPU run.

On the CPU (gloo) it runs too, with a smaller model, to check the script itself.
"""

import contextlib
import copy

import torch
import torch.nn.functional as F

import minidist
from minidist import comm
from minidist.fsdp import FSDP, CPUOffloadPolicy, ShardedState
from minidist.models.gpt import GPT, Block, GPTConfig

topo = minidist.runtime.init()  # nccl on a GPU; gloo/CPU runs it too, to check the script itself
dev = topo.device
cuda = dev.type == "cuda"
say = print if topo.rank == 0 else (lambda *a, **k: None)
cfg = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=256 if cuda else 64)
torch.manual_seed(0)
base = GPT(cfg).to(dev)
x = torch.randint(0, 256, (8, 64), device=dev)


def sync():
    if cuda:
        torch.cuda.synchronize()


@contextlib.contextmanager
def no_host_sync(enabled: bool):
    """Any operation that blocks the host on the GPU raises inside (FSDP's forward and backward must not)."""
    if not (cuda and enabled):
        yield
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def train(model, steps=3, opt=None, strict=False):
    """`steps` AdamW steps; strict: forward and backward of every step after the first (which
    initialises lazily: communicators, the units' order) must not block the host."""
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(steps):
        with no_host_sync(strict and i > 0):
            logits, _ = model(x)
            F.cross_entropy(logits.float().reshape(-1, 256), x.roll(-1, 1).reshape(-1)).backward()
        opt.step()
        opt.zero_grad()
    sync()
    return opt


def max_diff(sd):
    return max((sd[k].to(dev) - v).abs().max().item() for k, v in ref.state_dict().items())


ref = copy.deepcopy(base)
train(ref)

with comm.trace() as t:
    y = torch.ones(1 << 20, device=dev)
    comm.all_reduce(y, comm.ReduceOp.AVG)
    comm.all_gather(torch.empty(topo.world_size << 20, device=dev), y, async_op=True).wait()
    comm.reduce_scatter(torch.empty((1 << 20) // topo.world_size, device=dev), y, async_op=True).wait()
sync()
assert torch.all(y == 1) and len(t.records) == 3
say(f"comm on {dev} OK:", [r.op for r in t.records])

for hook in (None, minidist.ddp.comm_hooks.bf16_compress_hook):
    for view in (False, True):
        d = minidist.DDP(copy.deepcopy(base), bucket_cap_mb=1, gradient_as_bucket_view=view, comm_hook=hook)
        train(d)
        diff = max_diff(d.module.state_dict())
        say(f"DDP hook={getattr(hook, '__name__', None)} gradient_as_bucket_view={view}: max|ddp - ref| = {diff:.2e}")
        assert diff < (1e-5 if hook is None else 5e-2), diff

for stage, overlap in ((1, False), (2, False), (1, True)):  # ZeRO hooks the gradients itself: no DDP wrapper
    z = copy.deepcopy(base)
    train(z, opt=minidist.ShardedOptimizer(z.parameters(), torch.optim.AdamW, lr=1e-3, stage=stage, module=z,
                                           overlap_param_gather=overlap))
    diff = max_diff(z.state_dict())
    say(f"ZeRO-{stage} overlap_param_gather={overlap}: max|zero - ref| = {diff:.2e}")
    assert diff < 1e-5, diff
policy = minidist.precision.MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
z = copy.deepcopy(base)
train(z, opt=minidist.ShardedOptimizer(z.parameters(), torch.optim.AdamW, lr=1e-3, stage=2, mp_policy=policy, module=z))
d = minidist.DDP(copy.deepcopy(base), mp_policy=policy)
train(d)
for name, sd in (("ZeRO-2 bf16", z.state_dict()), ("DDP bf16", d.module.state_dict())):
    say(f"{name}: max|mp - fp32 ref| = {max_diff(sd):.2e}")
    assert max_diff(sd) < 3e-2, max_diff(sd)  # bf16 compute; ZeRO's parameters are the bf16-rounded masters


strategies = [("full_shard", {}), ("shard_grad_op", {"reshard_after_forward": False}),  # FSDP2's arguments
              ("no_shard", {"mesh": minidist.mesh.hybrid_mesh(topo, shard=1), "reshard_after_forward": False})]
if topo.world_size % 2 == 0:
    strategies.append(("hybrid_shard", {"mesh": minidist.mesh.hybrid_mesh(topo, shard=2)}))
for strategy, kw in strategies:
    for pd, offload in ((None, None), (torch.bfloat16, None), (torch.bfloat16, CPUOffloadPolicy())):
        f = FSDP(copy.deepcopy(base), wrap={Block}, offload_policy=offload, **kw,
                 mp_policy=minidist.precision.MixedPrecisionPolicy(pd, torch.float32 if pd else None))
        assert f.streams.cuda == cuda and (not cuda or f.streams.all_gather != torch.cuda.current_stream())
        opt = train(f, strict=offload is None)  # offload copies gradients to the host: that one blocks
        sd = f.full_state_dict(rank0_only=False, cpu_offload=False)
        diff = max_diff(sd)
        live = sum(u.shards.is_allocated and not u.shards.aliased for u in f.units)
        where = {t.device.type for p in f.parameters() for t in (p, *opt.state[p].values()) if torch.is_tensor(t) and t.dim()}
        say(f"FSDP {strategy:<14} param_dtype={pd} offload={offload is not None}: max|fsdp - ref| = {diff:.2e}, "
              f"unsharded units alive after step: {live}, shards and optimizer state on {sorted(where)}")
        assert diff < (1e-5 if pd is None else 5e-2), diff
        assert live == 0 and all(u.sharded_state is ShardedState.SHARDED for u in f.units)
        assert where == {"cpu" if offload else dev.type}, where
say(f"check OK on {dev} ({topo.backend}), world {topo.world_size}")
minidist.runtime.shutdown()

"""minidist.FSDP against torch's fully_shard (FSDP2): step time and peak memory.

    .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/fsdp_vs_torch.py [--reduce-scatter native,ring]
    .venv/bin/torchrun --standalone --nproc_per_node=N benchmarks/fsdp_vs_torch.py --mode memory   # N = 1, 2, 4
    .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/fsdp_vs_torch.py --mode overlap

Mode "speed" (default): the same GPT (wrapped per Block, full_shard, fp32 AdamW) under
both engines, gloo on the CPU, alternating rounds of steps in one invocation so that
machine load hits both alike. Prints the median step-time ratio (minidist / torch) and
the per-rank peak-memory ratio.

Mode "overlap": the units are layers whose forward and backward sleep (emulated accelerator
compute that leaves the CPU free, as PyTorch's own FSDP tests inject delays); step time
with prefetch on vs off shows how much all_gather / reduce_scatter time hides behind it.

Mode "memory": per-rank persistent bytes (params + grads + AdamW state) and peak bytes
of one step, against the ZeRO-3 formula (4 + 4 + 8) psi / N for psi fp32 parameters.

Peak memory on the CPU: torch has no CPU allocator statistics, so bytes of live tensor
storage are tracked with torch.distributed._tools.mem_tracker.MemTracker (a
TorchDispatchMode that sees every tensor a step creates, plus UntypedStorage.resize_,
which both engines use to free unsharded parameters). Tracking slows steps, so memory
is measured in separate, untimed steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from minidist import comm
from minidist.fsdp import FSDP
from minidist.models.gpt import GPT, Block, GPTConfig

CFG = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 8  # per rank


def build(engine: str):
    torch.manual_seed(0)
    model = GPT(CFG)
    if engine == "minidist":
        # one unit of prefetch each way, as torch's fully_shard does by default (same memory budget)
        model = FSDP(model, wrap={Block}, max_inflight_all_gathers=1)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def batch(step: int):
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    x = torch.randint(0, CFG.vocab_size, (BATCH, CFG.block_size), generator=g)
    return x, torch.roll(x, -1, dims=1)


def step(model, opt, i: int, zero_grad: bool = True) -> None:
    x, y = batch(i)
    logits, _ = model(x)
    F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1)).backward()
    opt.step()
    if zero_grad:
        opt.zero_grad(set_to_none=True)


def timed_steps(model, opt, n: int, start: int) -> list[float]:
    times = []
    for i in range(n):
        dist.barrier()
        t0 = time.perf_counter()
        step(model, opt, start + i)
        times.append(time.perf_counter() - t0)
    return times


def peak_bytes(model, opt, i: int) -> int:
    """Peak bytes of live CPU tensor storage during one step (params, grads, optimizer state included)."""
    import warnings
    from torch.distributed._tools.mem_tracker import MemTracker
    mt = MemTracker()
    with warnings.catch_warnings():  # MemTracker warns on the None grads it is handed; harmless
        warnings.simplefilter("ignore", UserWarning)
        mt.track_external(model, opt)
        with mt:
            step(model, opt, i)
    return mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def persistent_bytes(model, opt) -> int:
    def nbytes(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()
    total = 0
    for p in model.parameters():
        total += nbytes(p) + (nbytes(p.grad) if p.grad is not None else 0)
        total += sum(nbytes(v) for v in opt.state.get(p, {}).values() if torch.is_tensor(v) and v.dim() > 0)
    return total


class _Sleep(torch.autograd.Function):
    """Identity whose forward and backward each sleep: compute that does not occupy the CPU."""

    @staticmethod
    def forward(ctx, x, seconds: float):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(2 * ctx.seconds)  # backward costs about twice the forward
        return grad, None


class SleepLayer(torch.nn.Module):
    def __init__(self, width: int, seconds: float):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.seconds = seconds

    def forward(self, x):
        return torch.tanh(self.lin(_Sleep.apply(x, self.seconds)))


def overlap(steps: int) -> None:
    width, depth, seconds = 1024, 6, 0.02
    def run(**kw) -> float:
        torch.manual_seed(0)
        layers = torch.nn.Sequential(*(SleepLayer(width, seconds) for _ in range(depth)))
        model = FSDP(layers, wrap={SleepLayer}, **kw)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(4, width)
        times = []
        for i in range(steps + 2):
            dist.barrier()
            t0 = time.perf_counter()
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            times.append(time.perf_counter() - t0)
        return reduce_max(statistics.median(times[2:]))
    on = run(max_inflight_all_gathers=1)
    off = run(forward_prefetch=False, backward_prefetch=False)
    if dist.get_rank() == 0:
        print(f"{depth} layers of {width}x{width}, {seconds * 1e3:.0f} ms forward + {2 * seconds * 1e3:.0f} ms backward "
              f"sleep each (pure compute {3 * depth * seconds * 1e3:.0f} ms/step)")
        print(f"  prefetch on  {on * 1e3:8.1f} ms/step\n  prefetch off {off * 1e3:8.1f} ms/step")
        print(f"overlap speed-up (off / on): {off / on:.2f}x")


def reduce_max(value: float) -> float:
    t = torch.tensor(float(value))
    dist.all_reduce(t, dist.ReduceOp.MAX)
    return t.item()


def speed(rounds: int, steps: int, algorithms: list[str]) -> None:
    """Alternating rounds; one minidist engine per reduce_scatter algorithm (comm.reduce_scatter_algorithm)."""
    engines = {(f"minidist[{a}]" if len(algorithms) > 1 else "minidist"): (*build("minidist"), a) for a in algorithms}
    engines["torch"] = (*build("torch"), None)

    def algorithm(e: str):  # torch's FSDP2 calls torch.distributed directly: unaffected
        return comm.reduce_scatter_algorithm(engines[e][2] or "auto")

    for e in engines:  # warm-up (records minidist's prefetch order)
        with algorithm(e):
            timed_steps(*engines[e][:2], 2, 0)
    times: dict[str, list[float]] = {e: [] for e in engines}
    for r in range(rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for e in order:
            with algorithm(e):
                times[e] += timed_steps(*engines[e][:2], steps, 10 + r * steps)
    med = {e: reduce_max(statistics.median(t)) for e, t in times.items()}
    peak = {}
    for e in engines:
        with algorithm(e):
            peak[e] = reduce_max(peak_bytes(*engines[e][:2], 999))
    if dist.get_rank() == 0:
        psi = sum(p.numel() for p in GPT(CFG).parameters())
        print(f"GPT {psi / 1e6:.2f}M params, world {dist.get_world_size()}, gloo/CPU, "
              f"{rounds} alternating rounds x {steps} steps")
        for e in engines:
            print(f"  {e:<16} median step {med[e] * 1e3:8.1f} ms   peak {peak[e] / 2**20:8.2f} MiB/rank")
        for e in engines:
            if e != "torch":
                print(f"step-time ratio {e}/torch: {med[e] / med['torch']:.3f}   "
                      f"peak-memory ratio {e}/torch: {peak[e] / peak['torch']:.3f}")


def memory() -> None:
    n = dist.get_world_size()
    model, opt = build("minidist")
    step(model, opt, 0, zero_grad=False)  # keep the grads: the persistent state includes them
    persistent = reduce_max(persistent_bytes(model, opt))
    opt.zero_grad(set_to_none=True)
    peak = reduce_max(peak_bytes(model, opt, 1))
    if dist.get_rank() == 0:
        psi = sum(p.numel() for p in GPT(CFG).parameters())
        formula = 16 * psi / n
        print(f"world {n}: psi {psi}; persistent {persistent / 2**20:.3f} MiB/rank vs ZeRO-3 16 psi/N "
              f"{formula / 2**20:.3f} MiB (ratio {persistent / formula:.3f}); peak step {peak / 2**20:.3f} MiB/rank")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("speed", "memory", "overlap"), default="speed")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--reduce-scatter", default="auto",
                    help="minidist's reduce_scatter algorithm(s), comma-separated, e.g. native,ring: one engine each")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    try:
        if args.mode == "speed":
            speed(args.rounds, args.steps, args.reduce_scatter.split(","))
        elif args.mode == "overlap":
            overlap(args.steps * 2)
        else:
            memory()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

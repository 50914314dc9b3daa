"""minidist.FSDP against torch's fully_shard (FSDP2) and minidist.DDP: step time, memory, overlap.

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 benchmarks/fsdp_vs_torch.py [--reduce-scatter native,ring]
    ... --nproc_per_node=N benchmarks/fsdp_vs_torch.py --mode memory     # N = 1, 2, 4
    ... --nproc_per_node=2 benchmarks/fsdp_vs_torch.py --mode overlap

Every engine runs at its DEFAULT settings (minidist.FSDP(model, wrap={Block}), fully_shard
on every Block and the root, minidist.DDP(model)): the numbers are what a user gets.

Mode "speed" (default): the same GPT (full_shard, fp32 AdamW) under FSDP, FSDP2 and DDP,
gloo on the CPU, alternating rounds of steps in one invocation (the order rotates every
round) so that machine load hits all alike. Prints the median step times and the ratios
FSDP / FSDP2 (goal <= 0.50: minidist twice as fast) and FSDP / DDP (goal <= 1.30:
full_shard sends 1.5x DDP's bytes), and the peak-memory ratio FSDP / FSDP2 (goal <= 0.90).

Mode "memory": per-rank persistent bytes (params + grads + AdamW state) against the ZeRO-3
formula (4 + 4 + 8) psi / N, then the peak bytes of one step for FSDP and FSDP2, with and
without activation checkpointing (GPTConfig.activation_checkpointing: each Block's call
checkpointed by its parent), on an activation-heavy and a parameter-heavy GPT.

Mode "overlap": units are layers whose forward and backward sleep (emulated accelerator
compute that leaves the CPU free, as PyTorch's own FSDP tests inject delays). Per round,
one forward + backward each of: the plain module (compute only), FSDP, FSDP without
prefetch, FSDP2; and each engine's collectives alone, blocking, back to back (`comm`).
overhead = engine time - plain time (paired per round, median), hidden = 1 - overhead/comm
(minidist.comm.hidden_share, the one definition). The main thread's time blocked in collective
calls and waits is printed beside it, and is not called hidden.

Peak memory on the CPU: torch has no CPU allocator statistics, so bytes of live tensor
storage are tracked with torch.distributed._tools.mem_tracker.MemTracker (a
TorchDispatchMode that sees every tensor the main thread creates, plus
UntypedStorage.resize_, which both engines use to free unsharded parameters). It does not
see buffers inside the backend (gloo's reduce_scatter copies its whole input; minidist's
ring keeps two chunks of scratch on its thread), so the ratios leave out a cost that is
larger for FSDP2. Tracking slows steps: memory is measured in separate, untimed steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

from minidist import comm
from minidist.ddp import DDP
from minidist.fsdp import FSDP, prefetch_ahead
from minidist.models.gpt import GPT, Block, GPTConfig
from emulated import sleep  # benchmarks/emulated.py: the script's own directory

CFG = GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128)
BATCH = 8  # per rank
# (name, model, batch per rank) for --mode memory: activations dominate in the first,
# parameters in the second (the shape of a large model at a small micro-batch)
MEMORY_MODELS = (("activation-heavy", CFG, BATCH),
                 ("parameter-heavy", dataclasses.replace(CFG, n_layer=8, n_embd=512), 2))


def build(engine: str, cfg: GPTConfig = CFG):
    torch.manual_seed(0)
    model = GPT(cfg)
    if engine == "fsdp":
        model = FSDP(model, wrap={Block})
    elif engine == "ddp":
        model = DDP(model)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def batch(step: int, cfg: GPTConfig = CFG, rows: int = BATCH):
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    x = torch.randint(0, cfg.vocab_size, (rows, cfg.block_size), generator=g)
    return x, torch.roll(x, -1, dims=1)


def step(model, opt, i: int, zero_grad: bool = True, cfg: GPTConfig = CFG, rows: int = BATCH) -> None:
    x, y = batch(i, cfg, rows)
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


def peak_bytes(model, opt, i: int, cfg: GPTConfig = CFG, rows: int = BATCH) -> int:
    """Peak bytes of live CPU tensor storage during one step (params, grads, optimizer state included)."""
    from torch.distributed._tools.mem_tracker import MemTracker
    mt = MemTracker()
    with warnings.catch_warnings():  # MemTracker warns on the None grads it is handed; harmless
        warnings.simplefilter("ignore", UserWarning)
        mt.track_external(model, opt)
        with mt:
            step(model, opt, i, cfg=cfg, rows=rows)
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


def reduce_max(value: float) -> float:
    t = torch.tensor(float(value))
    dist.all_reduce(t, dist.ReduceOp.MAX)
    return t.item()


# -- speed -----------------------------------------------------------------------------------
def speed(rounds: int, steps: int, algorithms: list[str]) -> None:
    """Alternating rounds; one FSDP engine per reduce_scatter algorithm (comm.reduce_scatter_algorithm)."""
    engines = {(f"fsdp[{a}]" if len(algorithms) > 1 else "fsdp"): (*build("fsdp"), a) for a in algorithms}
    engines["fsdp2"] = (*build("fsdp2"), None)
    engines["ddp"] = (*build("ddp"), None)
    names = list(engines)

    def algorithm(e: str):  # torch's FSDP2 calls torch.distributed directly: unaffected
        return comm.reduce_scatter_algorithm(engines[e][2] or "auto")

    for e in names:  # warm-up (records minidist's prefetch order, builds DDP's buckets)
        with algorithm(e):
            timed_steps(*engines[e][:2], 2, 0)
    times: dict[str, list[float]] = {e: [] for e in names}
    for r in range(rounds):
        for e in names[r % len(names):] + names[:r % len(names)]:  # every engine goes first in turn
            with algorithm(e):
                times[e] += timed_steps(*engines[e][:2], steps, 10 + r * steps)
    med = {e: reduce_max(statistics.median(t)) for e, t in times.items()}
    peak = {}
    for e in names:
        with algorithm(e):
            peak[e] = reduce_max(peak_bytes(*engines[e][:2], 999))
    if dist.get_rank() == 0:
        psi = sum(p.numel() for p in GPT(CFG).parameters())
        print(f"GPT {psi / 1e6:.2f}M params, world {dist.get_world_size()}, gloo/CPU, default settings, "
              f"{rounds} alternating rounds x {steps} steps")
        for e in names:
            print(f"  {e:<16} median step {med[e] * 1e3:8.1f} ms   peak {peak[e] / 2**20:8.2f} MiB/rank")
        for e in names:
            if e.startswith("fsdp["):
                print(f"  {e}: step-time ratio to fsdp2 {med[e] / med['fsdp2']:.3f}")
        fsdp = next(e for e in names if e.startswith("fsdp") and e != "fsdp2")  # the first algorithm's
        label = "FSDP" if fsdp == "fsdp" else fsdp
        print(f"step-time ratio {label}/FSDP2: {med[fsdp] / med['fsdp2']:.3f}   (goal <= 0.50)")
        print(f"step-time ratio {label}/DDP: {med[fsdp] / med['ddp']:.3f}   (goal <= 1.30)")
        print(f"peak-memory ratio {label}/FSDP2: {peak[fsdp] / peak['fsdp2']:.3f}   (goal <= 0.90)")


# -- memory ----------------------------------------------------------------------------------
def memory() -> None:
    n = dist.get_world_size()
    model, opt = build("fsdp")
    step(model, opt, 0, zero_grad=False)  # keep the grads: the persistent state includes them
    persistent = reduce_max(persistent_bytes(model, opt))
    if dist.get_rank() == 0:
        psi = sum(p.numel() for p in GPT(CFG).parameters())
        formula = 16 * psi / n
        print(f"world {n}: psi {psi}; persistent {persistent / 2**20:.3f} MiB/rank vs ZeRO-3 16 psi/N "
              f"{formula / 2**20:.3f} MiB (ratio {persistent / formula:.3f})")
        print(f"peak of one step, MiB/rank (default settings; +ckpt: activation checkpointing of every Block)")
        print(f"  {'model':<34} {'FSDP':>8} {'FSDP2':>8} {'FSDP/FSDP2':>10}")
    worst = 0.0
    for name, cfg, rows in MEMORY_MODELS:
        peaks = {}
        for ckpt in (False, True):
            c = dataclasses.replace(cfg, activation_checkpointing=ckpt)
            for engine in ("fsdp", "fsdp2"):
                model, opt = build(engine, c)
                for i in range(2):  # warm-up: minidist records its order; AdamW creates its state
                    step(model, opt, i, cfg=c, rows=rows)
                peaks[engine, ckpt] = reduce_max(peak_bytes(model, opt, 2, cfg=c, rows=rows))
                del model, opt
            if dist.get_rank() == 0:
                f, t = peaks["fsdp", ckpt], peaks["fsdp2", ckpt]
                label = f"{name} {c.n_embd}x{c.n_layer} b{rows}" + (" +ckpt" if ckpt else "")
                print(f"  {label:<34} {f / 2**20:8.2f} {t / 2**20:8.2f} {f / t:10.3f}")
            worst = max(worst, peaks["fsdp", ckpt] / peaks["fsdp2", ckpt])
        if dist.get_rank() == 0:
            print(f"    activation checkpointing saves FSDP {1 - peaks['fsdp', True] / peaks['fsdp', False]:.1%}, "
                  f"FSDP2 {1 - peaks['fsdp2', True] / peaks['fsdp2', False]:.1%} of the peak")
    if dist.get_rank() == 0:
        print(f"peak-memory ratio FSDP/FSDP2 (default settings, worst row): {worst:.3f}   (goal <= 0.90)")


# -- overlap ---------------------------------------------------------------------------------
class SleepLayer(torch.nn.Module):
    def __init__(self, width: int, seconds: float):
        super().__init__()
        self.lin = torch.nn.Linear(width, width)
        self.seconds = seconds

    def forward(self, x):
        return torch.tanh(self.lin(sleep(x, self.seconds)))


def _sleeping(engine: str, width: int, depth: int, seconds: float):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(SleepLayer(width, seconds) for _ in range(depth)))
    if engine == "fsdp":
        model = FSDP(model, wrap={SleepLayer})
    elif engine == "fsdp no prefetch":
        model = FSDP(model, wrap={SleepLayer})
        prefetch_ahead(model.units, forward=0, backward=0)  # explicit prefetch lists, all empty
    elif engine == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _comm_time(units: list[list[int]], torch_native: bool) -> float:
    """One step's collectives alone, blocking, back to back: per unit two all_gathers (forward,
    backward) and one reduce_scatter, each as the engine issues it. `units`: each unit's padded
    parameters' elements. minidist: the coalesced all_gather of the unit's parameters into their
    regions (minidist.fsdp.all_gather) and the ring reduce_scatter on gloo; torch: one flat
    all_gather and one reduce_scatter per unit, as fully_shard issues them."""
    n = dist.get_world_size()
    torch_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor) if torch_native \
        else comm.reduce_scatter
    bufs = [(torch.ones(sum(sizes)), torch.empty(sum(sizes) // n), sizes) for sizes in units]
    t0 = time.perf_counter()
    for full, shard, sizes in bufs + bufs[::-1]:
        if torch_native:
            torch_gather(full, shard)
        else:
            comm.all_gather_coalesced(full.split(sizes), shard.split([s // n for s in sizes]))
    for full, shard, _ in bufs[::-1]:
        scatter(shard, full)
    return time.perf_counter() - t0


class _TorchBlocked:
    """(issue time, seconds blocked) of each collective torch's fully_shard calls (synchronous on CPU)."""

    NAMES = ("all_gather_single", "reduce_scatter_single", "all_gather_into_tensor", "reduce_scatter_tensor")

    def __init__(self):
        self.calls: list[list[float]] = []
        self._saved = {}

    def _timed(self, fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            work = fn(*args, **kwargs)
            self.calls.append([t0, time.perf_counter() - t0])
            return work if work is None else _TimedWait(work, self.calls[-1])
        return call

    def __enter__(self):
        self.calls = []
        for name in self.NAMES:
            if hasattr(dist, name):
                self._saved[name] = getattr(dist, name)
                setattr(dist, name, self._timed(self._saved[name]))
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)


class _TimedWait:
    def __init__(self, work, call: list[float]):
        self._work, self._call = work, call

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._call[1] += time.perf_counter() - t0

    def __getattr__(self, name):
        return getattr(self._work, name)


def _overlap_step(engine: str, model, x) -> tuple[float, list[float]]:
    """Forward + backward (every collective of the step completes inside backward): seconds, and
    the seconds the main thread was blocked issuing or waiting on collectives: [all, the first
    all_gather, the last reduce_scatter, all less the time spent waiting for a later rank].

    A rank that issues a collective before the others waits for them: load imbalance, not
    communication. Every rank's perf_counter reads the same system clock (one machine), so the
    lateness of the last rank to issue each collective is known exactly and subtracted.
    """
    tracer = _TorchBlocked() if engine == "fsdp2" else comm.trace()
    dist.barrier()
    with tracer as t:
        t0 = time.perf_counter()
        model(x).sum().backward()
        elapsed = time.perf_counter() - t0
    calls = t.calls if engine == "fsdp2" else [[r.issued_s, r.exposed_s] for r in t.records]
    if not calls:  # the plain module
        return elapsed, [0.0] * 4
    issued = torch.tensor([c[0] for c in calls], dtype=torch.float64)
    latest = issued.clone()
    dist.all_reduce(latest, dist.ReduceOp.MAX)
    own = [max(0.0, b - (late - i)) for (i, b), late in zip(calls, latest.tolist())]
    return elapsed, [sum(b for _, b in calls), calls[0][1], calls[-1][1], sum(own)]


def overlap(rounds: int) -> None:
    width, depth, seconds = 1024, 8, 0.02
    names = ("plain", "fsdp", "fsdp no prefetch", "fsdp2")
    models = {e: _sleeping(e, width, depth, seconds) for e in names}
    n = dist.get_world_size()
    units = [[-(-width // n) * n * width, -(-width // n) * n]] * depth  # padded weight and bias of each unit
    x = torch.randn(4, width)
    times: dict[str, list[float]] = {e: [] for e in (*names, "comm", "comm torch")}
    blocked: dict[str, list[list[float]]] = {e: [] for e in names}
    for r in range(rounds + 2):  # two warm-up rounds
        for e in names[r % 4:] + names[:r % 4]:
            model, opt = models[e]
            t, b = _overlap_step(e, model, x)
            times[e].append(t)
            blocked[e].append(b)
            opt.step()
            opt.zero_grad(set_to_none=True)
        dist.barrier()
        times["comm"].append(_comm_time(units, torch_native=False))
        dist.barrier()
        times["comm torch"].append(_comm_time(units, torch_native=True))
    times = {e: t[2:] for e, t in times.items()}
    med = {e: reduce_max(statistics.median(t)) for e, t in times.items()}
    overhead = {e: reduce_max(statistics.median(a - b for a, b in zip(times[e], times["plain"])))
                for e in names[1:]}
    waited = {e: [reduce_max(statistics.median(b[k] for b in blocked[e][2:])) for k in range(4)] for e in names[1:]}
    if dist.get_rank() == 0:
        _print_overlap(width, depth, seconds, rounds, med, overhead, waited)


def _print_overlap(width, depth, seconds, rounds, med, overhead, waited) -> None:
    print(f"{depth} layers of {width}x{width}, {seconds * 1e3:.0f} ms forward + {2 * seconds * 1e3:.0f} ms "
          f"backward sleep each, world {dist.get_world_size()}, forward + backward timed, median of {rounds} rounds")
    print(f"  plain module (compute only) {med['plain'] * 1e3:.1f} ms; one step's collectives alone, back to "
          f"back: minidist {med['comm'] * 1e3:.1f} ms, torch {med['comm torch'] * 1e3:.1f} ms")
    print("  overhead: step - plain step (also charges the engine's own CPU work: copies, hooks);\n"
          "  hidden = 1 - overhead / comm (minidist.comm.hidden_share);\n"
          "  blocked: main thread inside a collective's issue or wait (minidist.comm.trace; torch's calls timed),\n"
          "    with the first all_gather's and the last reduce_scatter's share (nothing can hide those), and\n"
          "    less the time spent waiting for a rank that issued the collective later (load imbalance)")
    print("  limit: 1 - (first + last) / comm, the most any schedule can hide (the first all_gather and\n"
          "    the last reduce_scatter have no compute to hide behind)")
    print(f"  {'engine':<17} {'fwd+bwd ms':>10} {'overhead ms':>11} {'hidden':>7} {'limit':>6} {'blocked ms':>10} "
          f"{'first':>6} {'last':>6} {'less late':>9}")
    hidden = {}
    for e in ("fsdp", "fsdp no prefetch", "fsdp2"):
        c = med["comm torch" if e == "fsdp2" else "comm"]
        b, first, last, own = waited[e]
        hidden[e] = comm.hidden_share(overhead[e], c)
        print(f"  {e:<17} {med[e] * 1e3:10.1f} {overhead[e] * 1e3:11.1f} {hidden[e]:7.1%} {1 - (first + last) / c:6.1%} "
              f"{b * 1e3:10.1f} {first * 1e3:6.1f} {last * 1e3:6.1f} {own * 1e3:9.1f}")
    print("hidden share: " + ", ".join(f"{label} {hidden[e]:.1%}" for label, e in (("FSDP", "fsdp"),
                                                                                    ("FSDP2 (torch)", "fsdp2")))
          + "   (goal >= 75%)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("speed", "memory", "overlap"), default="speed")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--reduce-scatter", default="auto",
                    help="minidist's reduce_scatter algorithm(s), comma-separated, e.g. native,ring: one engine each")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    try:
        if args.mode == "speed":
            speed(args.rounds, args.steps, args.reduce_scatter.split(","))
        elif args.mode == "overlap":
            overlap(args.rounds * 2)
        else:
            memory()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

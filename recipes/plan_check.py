"""The planner checked against this machine at 4 processes: planned step times and peak memory, measured.

    torchrun --standalone --nproc_per_node=4 -m recipes.plan_check       # prints table(...)

Step times: four layouts of a tiny GPT whose planned times are set apart by what the planner prices
(TP's calls on the critical path, 1F1B's bubble at m = 2 and m = 1), run by the trainer's own step
(minidist.compare.measure.Bench) under emulated compute (model.emulate_flops_per_s: each matmul a
kernel of its FLOPs at that rate, minidist.models.emulated), so that 2 CPU cores stand for four
accelerators. The planner is told this machine's rates, none fitted to the step times: the emulated
FLOP/s as the peak (efficiency 1) and gloo's alpha and beta from comm.calibrate over the same ranks
(minidist.compare.hardware). What it does not price is the host's work outside the kernels (the
embedding, norms, loss, optimizer step, the pipeline's scheduling), so measured times run above it.

The tests hold both to their tolerances (tests/compare/test_plan.py: the order of step times and each within
25%; each peak within 5%); this command prints the numbers the docs quote (docs/comparison.md).

Memory: the planner's peak per GPU (minidist.compare.plan.memory) against torch's allocator
(minidist.compare.measure.measure_memory) for ZeRO-2, FSDP, DDP x TP2 with SP, FSDP x TP2, dp2 x cp2
and dp2 x pp2 (1F1B, 2 micro-batches: the fuller stage's peak, the first's).
"""

from __future__ import annotations

import torch.distributed as dist

from minidist import runtime
from minidist.compare.hardware import Hardware
from minidist.compare.plan import GPTModel, Layout, memory, step

TINY = ["model.n_layer=4", "model.n_embd=64", "model.n_head=2", "model.block_size=32", "data=synthetic",
        "data.train_samples=512", "data.val_samples=8", "trainer.batch_size=8"]
MODEL = GPTModel(4, 64, 2, 256)
SEQ = 32
RATE = 1e9
"""Emulated FLOP/s: ~170 ms of kernels per step at dp4, against the few ms of host work the planner does not price."""
TIMED = {  # the planner's Layout at a global batch of 16, the row's strategy and trainer overrides
    "dp4 ddp": (Layout(4, micro_batch=4), {}, {"batch_size": 4}),
    "dp2 x tp2": (Layout(2, 2, micro_batch=8, sequence_parallel=False), {"tp_size": 2}, {"batch_size": 4}),
    "dp2 x pp2, m=2": (Layout(2, pp=2, micro_batch=4), {"pp_size": 2}, {"batch_size": 4, "microbatches": 2}),
    "dp2 x pp2, m=1": (Layout(2, pp=2, micro_batch=8), {"pp_size": 2}, {"batch_size": 4, "microbatches": 1}),
}
MEASURED = {"zero2": False, "full_shard": False, "ddp+tp2": True, "full_shard+tp2": False, "ddp+cp2": False}
"""The comparison's rows measured for memory (row: sequence and vocabulary parallel; global batch 32)."""
PIPELINED = {"ddp+pp2": (Layout(2, pp=2, micro_batch=4), {"pp_size": 2}, {"batch_size": 4, "microbatches": 2})}
"""dp2 x pp2 (the comparison has no pp rows): through the trainer's pipeline step, global batch 16."""


def time_overrides() -> list[str]:
    return TINY + ["trainer.grad_clip=1.0", f"model.emulate_flops_per_s={RATE}", "strategies=[ddp]"]


def memory_overrides() -> list[str]:
    sp = [f"strategy_options.{r.partition('+')[0]}.{k}=true" for r, on in MEASURED.items() if on
          for k in ("sequence_parallel", "vocab_parallel")]
    return TINY + ["trainer.grad_clip=0"] + sp + [f"strategies=[{','.join(MEASURED)}]"]


def step_times(overrides: list[str], steps: int = 3) -> dict:
    """On every rank (a collective): this machine's link (comm.calibrate over the world) and, per TIMED row,
    this rank's trainer step times after two warm-up steps, each after a barrier."""
    from omegaconf import OmegaConf

    from minidist import comm
    from minidist.compare.measure import Bench
    from minidist.recipes.compare import compose
    from minidist.train.data import build_datasets

    cfg = compose(overrides, world=(4, 4))
    topo = runtime.init("gloo")
    train_ds = build_datasets(cfg, topo)[0]
    out = {"link": comm.calibrate(iters=5)}
    for row, (_, strategy, trainer) in TIMED.items():
        # the comparison's pipeline shares P x trainer.batch_size sequences in pp_microbatches pieces
        c = OmegaConf.merge(cfg, {"trainer": trainer, "pp_microbatches": trainer.get("microbatches", 1)})
        bench = Bench(c, OmegaConf.merge(c.strategy_options.ddp, strategy), topo, train_ds)
        times = []
        for _ in range(2 + steps):
            dist.barrier()
            start, end = bench.step()
            times.append(end - start)
        out[row] = times[2:]
        del bench
    return out


def peaks(overrides: list[str]) -> dict[str, int]:
    """On every rank: per MEASURED and PIPELINED row, this rank's allocator peak (measure_memory: two steps after
    two warm-up ones)."""
    from omegaconf import OmegaConf

    from minidist.compare.rows import row_strategy
    from minidist.compare.measure import measure_memory
    from minidist.recipes.compare import compose
    from minidist.train.data import build_datasets

    cfg = compose(overrides, world=(4, 4))
    topo = runtime.init("gloo")
    train_ds = build_datasets(cfg, topo)[0]
    out = {row: measure_memory(cfg, row_strategy(cfg, row), topo, train_ds)["allocator"] for row in cfg.strategies}
    for row, (_, strategy, trainer) in PIPELINED.items():
        # the comparison's pipeline shares P x trainer.batch_size sequences in pp_microbatches pieces
        c = OmegaConf.merge(cfg, {"trainer": trainer, "pp_microbatches": trainer["microbatches"]})
        out[row] = measure_memory(c, OmegaConf.merge(c.strategy_options.ddp, strategy), topo, train_ds)["allocator"]
    return out


def times_vs_plan(per_rank: list[dict]) -> dict[str, tuple[float, float]]:
    """Per TIMED row (planned s, measured s): the plan on this machine's link at RATE; measured, the median over
    steps of the slowest rank's step."""
    hw = Hardware(gpus_per_node=4, peak_flops=RATE, link=per_rank[0]["link"])
    out = {}
    for row, (lay, _, _) in TIMED.items():
        slowest = sorted(max(s) for s in zip(*(r[row] for r in per_rank)))
        out[row] = step(MODEL, lay, SEQ, 16, "fp32", hw, efficiency=1.0)["step_s"], slowest[len(slowest) // 2]
    return out


def planned_memory() -> dict[str, tuple[Layout, dict]]:
    """Per memory row (its Layout, the planner's peak per GPU: plan.memory's dict): a formula, nothing measured."""
    layouts = {row: lay for row, (lay, _, _) in PIPELINED.items()} | {"ddp+cp2": Layout(2, cp=2, micro_batch=16)}
    for row, on in MEASURED.items():
        strategy, _, t = row.partition("+tp")
        t = int(t or 1)
        layouts.setdefault(row, Layout(4 // t, t, strategy=strategy, micro_batch=8 * t, sequence_parallel=on))
    return {row: (lay, memory(MODEL, lay, SEQ, "fp32", Hardware(gpus_per_node=4), device="cpu"))
            for row, lay in layouts.items()}


def memory_vs_plan(per_rank: list[dict]) -> dict[str, tuple[float, float, list[int]]]:
    """Per row (planned bytes, of them in flight, the measured peaks compared): the middle two ranks';
    under a pipeline the fuller stage's, the most of all ranks (the planner's peak per GPU)."""
    out = {}
    for row, (lay, planned) in planned_memory().items():
        measured = sorted(r[row] for r in per_rank)
        out[row] = planned["total"], planned["in_flight"], measured[-1:] if lay.pp > 1 else measured[1:3]
    return out


def planned_for(planned: float, in_flight: float, measured: float) -> float:
    """The plan's peak for the outcome `measured` shows: with a collective's staging still in flight at that
    instant (`planned`), or landed before it (`planned - in_flight`); whichever is nearer."""
    return min((planned, planned - in_flight), key=lambda p: abs(p - measured))


def table(times: dict, mem: dict, link) -> str:
    lines = [f"this machine's link (comm.calibrate, 4 ranks): {link.describe()}",
             f"emulated compute: {RATE:.3g} FLOP/s; GPT L = {MODEL.layers}, h = {MODEL.hidden}, s = {SEQ}, "
             f"global batch 16",
             f"{'layout':<18}{'planned ms':>11}{'measured ms':>12}{'planned/measured':>18}"]
    lines += [f"{row:<18}{p * 1e3:>11.1f}{m * 1e3:>12.1f}{p / m - 1:>+18.1%}" for row, (p, m) in times.items()]
    lines += ["", f"{'row':<18}{'planned MB':>11}{'in flight':>10}{'measured MB':>12}{'planned/measured':>18}"]
    for row, (p, flying, ms) in mem.items():
        for m in ms:
            shown = planned_for(p, flying, m)
            lines.append(f"{row:<18}{p / 1e6:>11.3f}{flying / 1e6:>10.3f}{m / 1e6:>12.3f}"
                         f"{shown / m - 1:>+18.1%}{' (landed)' if shown != p else ''}")
    return "\n".join(lines)


def main() -> None:
    try:
        with runtime.distributed("gloo", timeout_s=300) as topo:
            if topo.world_size != 4:
                raise runtime.UsageError(f"recipes.plan_check runs at 4 processes, not {topo.world_size}: "
                                         f"torchrun --standalone --nproc_per_node=4 -m recipes.plan_check")
            times = step_times(time_overrides())
            mem = peaks(memory_overrides())
            everyone = [None] * topo.world_size
            dist.all_gather_object(everyone, (times, mem))
            if topo.rank == 0:
                print(table(times_vs_plan([t for t, _ in everyone]), memory_vs_plan([m for _, m in everyone]),
                            times["link"]))
    except Exception as exc:  # noqa: BLE001 - one line per rank; MINIDIST_TRACEBACK=1 for the trace
        runtime.exit_on_error(exc)
    runtime.exit_process(0)


if __name__ == "__main__":
    main()

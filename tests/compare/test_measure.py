"""A real comparison at world 2 (gloo pool): the trace against the formulas, the time definitions, the
tables and the timeline, and the memory estimate against torch's allocator events (within 5% in the
comparison's run, within 2% for every strategy in both training loops)."""

from __future__ import annotations

import functools
import json
from collections import Counter

import pytest

from minidist.comm import CostModel
from minidist.compare.analysis import strategy_row, tensor_parallel_of
from minidist.compare.analytic import calls_by_op, plan
from minidist.shape import ModelShape
from minidist.strategies.fsdp import padded_unit
from minidist.compare.report import TABLES, terminal
from minidist.compare.timeline import chrome_trace, draw_png

STRATEGIES = ["ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "hybrid_shard", "ddp+tp2",
              "ddp+pp2"]
MEASURED_MEMORY = ["ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard"]
# A GPT whose every FSDP unit has an even number of elements (root 18560, blocks 49984), at a batch whose
# activations outweigh one copy of the gradients several times over: whether gloo or the flight recorder
# still holds a finished collective's gradients at the peak is timing (one S), and must stay within 5%.
TINY = ["model.n_layer=4", "model.n_embd=64", "model.n_head=2", "model.block_size=32", "data=synthetic",
        "data.train_samples=512", "data.val_samples=8", "trainer.batch_size=32", "warmup_steps=2", "steps=2",
        "replay_repeats=2"]


def body_measure(overrides: list[str]) -> list[dict]:
    import time

    from minidist import runtime
    from minidist.compare.rows import row_strategy
    from minidist.compare.measure import measure_strategy
    from minidist.train.data import build_datasets
    from recipes.compare import compose

    cfg = compose(overrides)
    topo = runtime.init("gloo")
    train_ds = build_datasets(cfg, topo)[0]
    t0 = time.perf_counter()
    return [measure_strategy(cfg, row_strategy(cfg, s), topo, train_ds, t0, s) for s in cfg.strategies]


@functools.lru_cache(maxsize=2)
def profile_of(overrides: tuple[str, ...]):
    """The fake-tensor step profile and shape of a configuration's model and batch."""
    from minidist.compare.run import _profile
    from recipes.compare import compose
    return _profile(compose(list(overrides) + ["strategies=[ddp]"]))  # the plain model's: any world


_RUNS: dict[tuple, list] = {}


def compare_rows(run_dist, world: int, overrides: list[str], strategies: list[str], memory: bool = True):
    """Every rank's measurements of `strategies` (run once per configuration in a session), and the rows."""
    from minidist.compare.rows import row_strategy
    from recipes.compare import compose

    overrides = overrides + [f"strategies=[{','.join(strategies)}]", f"memory={str(memory).lower()}"]
    key = (world, tuple(overrides))
    if key not in _RUNS:
        _RUNS[key] = run_dist(world, body_measure, overrides, timeout=300)
    per_rank = _RUNS[key]
    per_strategy = [list(raws) for raws in zip(*per_rank)]
    cfg = compose(overrides, world=(world, world))
    prof, shape = profile_of(tuple(o for o in overrides if not o.startswith(("strategies", "memory"))))
    rows = [strategy_row(raws, shape, CostModel(1e-4, 1e-9), prof, cfg, row_strategy(cfg, raws[0]["strategy"]))
            for raws in per_strategy]
    return cfg, shape, per_strategy, rows


def check_bytes(cfg, shape: ModelShape, per_strategy, rows, world: int) -> None:
    """The trace counts what the formulas say, call by call; every rank alike (no broadcast here)."""
    for raws, row in zip(per_strategy, rows):
        name = row["strategy"]
        if row["pp"]:  # each rank its own stage's calls: test_kernel_bytes.py
            continue
        lay, wire, tp = tensor_parallel_of(raws[0], shape, cfg)
        calls = plan(name.partition("+")[0], lay, world, wire, grad_clip=cfg.trainer.grad_clip > 0, tp=tp)
        assert row["bytes"]["trace"] == pytest.approx(row["bytes"]["formula"]), name
        assert row["bytes"]["payload"] == sum(c.payload for c in calls), name
        assert {op: round(n) for op, n in row["calls"].items()} == calls_by_op(calls), name


def _check_timeline(per_strategy, world: int, steps: int, tmp_path) -> None:
    raws = [raw for raws in per_strategy for raw in raws]
    trace = json.loads(json.dumps(chrome_trace(raws)))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in events} == set(range(world))
    assert all(e["dur"] >= 0 and isinstance(e["ts"], float) for e in events)
    for raw in raws:
        mine = [e for e in events if e["pid"] == raw["rank"] and e["args"].get("strategy") == raw["strategy"]]
        comm = [e for e in mine if e["cat"] == "comm"]
        assert len(comm) == len(raw["records"]) > 0, raw["strategy"]
        phases = [e for e in mine if e["cat"] == "phase"]
        if raw["pp"]:  # a pipeline's micro-batches interleave the phases: the runtime's actions instead
            actions = [e["name"] for e in mine if e["cat"] == "pipeline"]
            assert not phases and len(actions) == sum(map(len, raw["pp"]["timelines"])) and "F0" in actions
            assert "B0" in actions and len(raw["pp"]["timelines"]) == steps
            continue
        assert sorted(e["name"] for e in phases) == sorted(["forward", "backward", "optimizer"] * steps)
        by_step = {}
        for e in phases:  # forward, backward, optimizer follow each other inside their step
            by_step.setdefault(e["args"]["step"], {})[e["name"]] = (e["ts"], e["ts"] + e["dur"])
        for p in by_step.values():
            assert p["forward"][1] <= p["backward"][0] + 1 and p["backward"][1] <= p["optimizer"][0] + 1
    assert draw_png(raws, tmp_path / "timeline.png").stat().st_size > 0


WORLD_2 = TINY + ["trainer.grad_clip=0"]


def test_world_2_bytes_time_tables_timeline_and_memory(run_dist, tmp_path):
    cfg, shape, per_strategy, rows = compare_rows(run_dist, 2, WORLD_2, STRATEGIES)
    assert [r["strategy"] for r in rows] == STRATEGIES
    by = {r["strategy"]: r for r in rows}
    s, root = (sum(padded_unit(u, 2) for u in shape.unit_param_rows),  # whole rows per rank; the root's backward
               padded_unit(shape.unit_param_rows[0], 2))               # gather is skipped
    assert by["full_shard"]["bytes"]["trace"] / by["shard_grad_op"]["bytes"]["trace"] == (3 * s - root) / (2 * s)
    ddp = by["ddp"]["bytes"]["trace"]
    for name in ("zero1", "zero2"):  # reduce_scatter + all_gather: DDP's bytes (buckets padded to N)
        assert by[name]["bytes"]["trace"] == pytest.approx(ddp, rel=1e-3)
    assert by["zero1_broadcast"]["bytes"]["trace"] == pytest.approx(1.5 * ddp)  # + S(N-1)/N of broadcasts
    assert by["hybrid_shard"]["bytes"]["trace"] == by["full_shard"]["bytes"]["trace"]  # G = N: no replicas...
    assert "this is full_shard" in by["hybrid_shard"]["note"]                          # ...and the row says so
    check_bytes(cfg, shape, per_strategy, rows, 2)
    _check_timeline(per_strategy, 2, cfg.steps, tmp_path)
    for row in rows:
        t, b = row["time"], row["bytes"]
        assert t["overhead"] == pytest.approx(t["step"]["median"] - t["baseline"]["median"])  # measured, not derived
        assert t["alone"] > 0 and t["hidden"] == pytest.approx(1 - t["overhead"] / t["alone"])
        assert t["predicted_error"] == pytest.approx(t["predicted"] / t["alone"] - 1)
        assert all(o["busbw_GBps"] > 0 for o in row["alone"]["ops"].values())
        assert t["step"]["p25"] <= t["step"]["median"] <= t["step"]["p75"]
    printed = terminal(rows, by["ddp"]["bytes"]["trace"])
    assert all(len(line) <= 120 for line in printed.splitlines()), max(printed.splitlines(), key=len)
    assert sum(title in printed for title in TABLES) == 3 and "this is full_shard" in printed
    check_tp_row(cfg, shape, per_strategy[STRATEGIES.index("ddp+tp2")], by["ddp+tp2"], by["ddp"], printed)
    for row in (by[name] for name in MEASURED_MEMORY):  # the estimate against torch's allocator events
        m = row["memory"]
        assert abs(m["error"]) <= 0.05, (row["strategy"], m["allocator"], m["estimate"])
        assert m["by_role"]["optimizer"] > 0 and m["by_role"]["parameters"] > 0


def check_tp_row(cfg, shape: ModelShape, raws, row: dict, ddp: dict, printed: str) -> None:
    """ddp+tp2 at world 2 is pure tensor parallelism (dp = 1): every collective of its step is one of
    minidist.tp.cost's for the batch its tp group shares (2 x trainer.batch_size: the same global batch as
    ddp's), plus DDP's reducer on its one-rank group (nothing sent); parameters per rank as sliced."""
    from minidist.tp import cost
    steps, t = cfg.steps, raws[0]["tp"]
    assert (t["size"], t["dp"], t["batch"]) == (2, 1, 2 * cfg.trainer.batch_size)
    for raw in raws:
        got = Counter((r["op"], r["payload_bytes"] // 4, r["group_size"]) for r in raw["records"])
        want = Counter({(op, numel, 2): k * steps for (op, numel), k in
                        cost.collectives(cfg.model, t["batch"], cfg.model.block_size).items()})
        want += Counter({("all_reduce", b, 1): steps for b in raw["bucket_numels"]})  # DDP over dp = 1
        assert got == want, (got, want)
    b = row["bytes"]
    assert b["formula"] == b["trace"] == cost.step_bytes(cfg.model, t["batch"], cfg.model.block_size, 2)
    assert row["closed_form"] == "8Lbshe(T-1)/T" and "TP = 8Lbshe(T-1)/T on the critical" in printed
    sliced = row["tp"]["psi_per_rank"]
    assert shape.psi / 2 < sliced < shape.psi  # the blocks halve, embeddings and norms stay whole
    m = row["memory"]
    assert m["by_role"]["parameters"] == 4 * sliced == pytest.approx(ddp["memory"]["by_role"]["parameters"] * sliced
                                                                      / shape.psi)
    assert m["estimate"] is None and m["allocator"] > 0  # measured, never made up


def body_ledger_allocates_nothing(overrides: list[str]) -> tuple[bool, int, int]:
    """DDP on the CPU reduces in place: through a ledger-measured step its flat buffers stay unallocated."""
    from minidist import runtime
    from minidist.compare.measure import Bench
    from minidist.compare.memory import MemoryLedger, roles_of
    from minidist.train.data import build_datasets
    from recipes.compare import compose

    cfg = compose(overrides)
    topo = runtime.init("gloo")
    bench = Bench(cfg, cfg.strategy_options["ddp"], topo, build_datasets(cfg, topo)[0])
    for _ in range(2):
        bench.step()
    buckets = bench.model.reducer.buckets
    assert all(b.in_place for b in buckets) and all(b._flat is None for b in buckets)
    ledger = MemoryLedger(roles_of(bench.model, bench.optimizer))
    with ledger:
        bench.step()
    return all(b._flat is None for b in buckets), ledger.peak.total, len(buckets)


def test_the_ledger_allocates_nothing_the_step_would_not(run_dist):
    for unallocated, peak, buckets in run_dist(2, body_ledger_allocates_nothing, TINY):
        assert unallocated and peak > 0 and buckets >= 1


def test_the_whole_report_fits_120_columns_and_writes_every_file(run_dist, tmp_path, capsys):
    from minidist.compare.run import report
    cfg, _, per_strategy, _ = compare_rows(run_dist, 2, WORLD_2, STRATEGIES)
    result = report(cfg, tmp_path, per_strategy, CostModel(1e-4, 1e-9))
    printed = capsys.readouterr().out
    assert all(len(line) <= 120 for line in printed.splitlines()), max(printed.splitlines(), key=len)
    for name in ("table.md", "table.csv", "results.json", "comparison.png", "timeline.json", "timeline.png",
                 "projection.csv", "projection.png"):
        assert (tmp_path / name).stat().st_size > 0, name
    table = (tmp_path / "table.md").read_text()
    assert table.count("| strategy |") == 5 and "this is full_shard" in table
    proj = result["projection"]
    assert {r["cluster"] for r in proj} == {"calibrated", *cfg.projection.clusters}
    assert all(r["memory_GB"] is None for r in proj if r["cluster"] == "calibrated")  # this machine: no device
    assert "zero1" in printed and "fits 80/141 GB from" in printed
    tp = [r for r in proj if r["strategy"] == "ddp+tp2"]  # TP on the critical path: it never hides
    assert tp and all(r["comm_critical_s"] > 0 and not r["hides"] for r in tp)
    h100 = {r["ranks"]: r for r in tp if r["cluster"] == "h100_ib_8x400g"}
    assert not h100[8]["leaves_node"] and h100[16]["leaves_node"]  # tp within a node, dp across nodes
    assert h100[8]["comm_s"] == pytest.approx(h100[8]["comm_critical_s"] + h100[8]["comm_backward_s"])
    pp = [r for r in proj if r["strategy"] == "ddp+pp2"]  # pure PP at world 2: its bubble as time at every scale
    assert pp and all(r["bubble"] == pytest.approx(1 / 5) and r["bubble_s"] > 0 and r["pp_p2p_s"] > 0 for r in pp)
    assert "bubble (formula)" in printed and "0.20)" in printed and "bubble 0.20:" in printed


LOOP_STRATEGIES = ["ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "hybrid_shard", "no_shard"]
LOOPS = {"zero_grad after step": ("step", "zero_grad"), "zero_grad before forward": ("zero_grad", "step")}
# A batch whose activations weigh little: one gradient copy (psi x 4 bytes) is ~17% of the peak, so an
# engine (or its bookkeeping) keeping the last step's gradients into the next one cannot hide in 2%.
SMALL_BATCH = TINY[:7] + ["trainer.batch_size=4", "trainer.grad_clip=0"]


def _loop_step(bench, order: tuple[str, str]) -> None:
    """One step of a plain loop: forward, backward, then step and zero_grad(set_to_none=True) in `order`
    (zero_grad first: it runs before the next forward)."""
    opt = bench.optimizer
    batch = [b.to(bench.topo.device) for b in next(bench.run.stream)]
    if order[0] == "zero_grad":
        opt.zero_grad(set_to_none=True)
    bench.task.task.loss(bench.model, batch).backward()
    opt.step()
    if order[0] == "step":
        opt.zero_grad(set_to_none=True)


def body_loop_peaks(overrides: list[str]) -> dict:
    """Per strategy and loop, this rank's peak live bytes (torch's allocator events) over two steps."""
    import gc

    from minidist import runtime
    from minidist.compare.allocator import AllocatorPeak
    from minidist.compare.measure import Bench
    from minidist.train.data import build_datasets
    from recipes.compare import compose

    cfg = compose(overrides)
    topo = runtime.init("gloo")
    train_ds = build_datasets(cfg, topo)[0]
    out = {}
    for name in cfg.strategies:
        gc.collect()  # nothing allocated before the profiler may die inside it (allocator.py)
        with AllocatorPeak(topo.device) as peak:
            bench = Bench(cfg, cfg.strategy_options[name], topo, train_ds)
            for _ in range(2):  # AdamW's state, DDP's bucket rebuild, FSDP's recorded order
                _loop_step(bench, LOOPS["zero_grad after step"])
            for order in LOOPS.values():
                for _ in range(2):
                    with peak.window():
                        _loop_step(bench, order)
            del bench
            gc.collect()
        out[name] = {loop: max(peak.peaks[2 * i:2 * i + 2]) for i, loop in enumerate(LOOPS)}
    return out


@pytest.mark.alone  # the peak instant holds what gloo's threads have not yet let go: timing, under another worker's load
def test_memory_estimate_within_2_percent_in_both_loops(run_dist):
    from minidist.compare.estimate import estimate_memory
    from recipes.compare import compose

    overrides = SMALL_BATCH + [f"strategies=[{','.join(LOOP_STRATEGIES)}]"]
    per_rank = run_dist(2, body_loop_peaks, overrides, timeout=300)
    cfg = compose(overrides)
    prof, _ = profile_of(tuple(SMALL_BATCH))
    for name in LOOP_STRATEGIES:
        est = estimate_memory(prof, cfg.strategy_options[name], 2, optimizer=cfg.optim.name, backend="gloo").total
        for loop in LOOPS:
            measured = max(r[name][loop] for r in per_rank)  # the rank that holds the most
            assert abs(est / measured - 1) <= 0.02, (name, loop, est, measured)


def body_interrupted(out: str) -> dict:
    """compare() at world 2 with Ctrl-C on rank 0 once the first strategy is measured (a test's own hook on the
    progress of the run: the signal lands where a user's would, between phases)."""
    import contextlib
    import io
    import os
    import signal

    import minidist.compare.run as run_mod
    from minidist import runtime
    from recipes.compare import compose

    topo = runtime.init("gloo")

    class CtrlCAfterFirst(run_mod.Progress):
        def done(self, name: str) -> None:
            super().done(name)
            if topo.rank == 0 and name == "ddp":
                os.kill(os.getpid(), signal.SIGINT)

    cfg = compose(TINY + ["strategies=[ddp,zero1]", "memory=false", f"out_dir={out}", "name=cut"], world=(2, 2))
    real, run_mod.Progress = run_mod.Progress, CtrlCAfterFirst
    try:
        with contextlib.redirect_stdout(io.StringIO()) as stdout, contextlib.redirect_stderr(io.StringIO()) as stderr:
            result = run_mod.compare(cfg, topo) or {}
    finally:
        run_mod.Progress = real
    return {"interrupted": result.get("interrupted"), "rows": [r["strategy"] for r in result.get("rows", [])],
            "stdout": stdout.getvalue(), "stderr": stderr.getvalue()}


def test_an_interrupted_comparison_saves_what_it_measured(run_dist, tmp_path):
    """Ctrl-C between strategies: every rank stops at the next phase, the main process writes the strategies
    measured so far and says where; the progress bar named each strategy and phase as it went."""
    main, other = run_dist(2, body_interrupted, str(tmp_path), timeout=300)
    assert main["interrupted"] == "SIGINT" and other["interrupted"] == "a signal on another rank"
    assert main["rows"] == ["ddp"], main
    run = tmp_path / "cut"
    line = f"interrupted (SIGINT) after 1 of 2 strategies: their rows are in {run}; not measured: zero1"
    assert line in main["stdout"] and (run / "INTERRUPTED").read_text() == line + "\n", main["stdout"]
    table = (run / "table.md").read_text()
    assert "| ddp |" in table and "zero1" not in table
    assert all((run / f).stat().st_size for f in ("comparison.png", "results.json", "projection.png"))
    bar = main["stderr"]
    assert "[1/2] ddp: warm-up" in bar and "[1/2] ddp: alone" in bar and "[1/2] ddp measured in" in bar, bar
    assert "[2/2] zero1: warm-up" in bar and "zero1 measured" not in bar, bar
    assert not other["stderr"] and not other["stdout"]  # rank 1 says nothing (no gloo "Connection closed")

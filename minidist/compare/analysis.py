"""From every rank's raw measurements of one strategy to one row of the comparison table.

Definitions (per optimizer step; times are means over ranks and measured steps):

  bytes        payload S and ring bytes sent per rank as minidist.comm.trace counts them (rank 0),
               beside the same formulas applied to the model's layout (minidist.compare.analytic)
  wire time    of one collective on rank 0: completion - max(the last member's issue, completion
               of the collective before it on the same process group). A span from issue to
               completion also holds the wait for the slowest rank to arrive and the time queued
               behind earlier work of the group (gloo's queue, NCCL's stream); the wire time does
               not. It still holds the backend's threads waiting for a core (gloo on a busy CPU)
  algbw        payload / wire time; busbw = algbw * 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
               reduce_scatter), 1 (broadcast): nccl-tests' definitions
  predicted    CostModel.predict (ring) of the collective the backend really runs
  step         forward start to optimizer end
  exposed      time the main thread was blocked on communication: inside a Work/Future wait,
               or inside a synchronous collective
  compute      step - exposed (everything else the main thread did)
  hidden       time some collective was in flight while the main thread was not blocked;
               hidden share = hidden / time communicating (HTA's overlap definition, with the
               main thread standing in for the compute stream)
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

from minidist.comm import CostModel
from minidist.compare import intervals
from minidist.compare.analytic import CLOSED_FORM, Layout, busbw_factor, plan, ring_bytes
from minidist.compare.estimate import estimate_memory
from minidist.compare.profile import StepProfile


def arrivals(records_by_rank: list[list[dict]]) -> list[list[float]]:
    """When the last member of each collective's group issued it (the earliest it can start).

    Collectives on one group are matched by issue order on every rank, so the k-th record of
    group g on one rank and the k-th of g on another are the same collective.
    """
    issued: dict[tuple[str, int], float] = {}
    keys = []
    for records in records_by_rank:
        seen: dict[str, int] = {}
        mine = []
        for r in records:
            k = (r["group"], seen.get(r["group"], 0))
            seen[r["group"]] = k[1] + 1
            issued[k] = max(issued.get(k, r["issued"]), r["issued"])
            mine.append(k)
        keys.append(mine)
    return [[issued[k] for k in mine] for mine in keys]


def wire_times(records: list[dict], arrived: list[float] | None = None) -> list[float]:
    """Each record's wire time (see the module docstring), in record order."""
    arrived = arrived or [r["issued"] for r in records]
    out = [0.0] * len(records)
    last_done: dict[str, float] = {}
    for i in sorted(range(len(records)), key=lambda i: records[i]["issued"]):
        r = records[i]
        done = r["completed"] if r["completed"] is not None else r["issued"]
        start = max(arrived[i], last_done.get(r["group"], arrived[i]))
        out[i] = max(0.0, done - start)
        last_done[r["group"]] = max(done, last_done.get(r["group"], done))
    return out


def op_stats(records: list[dict], steps: int, cost: CostModel, backend: str,
             arrived: list[float] | None = None) -> dict[str, dict]:
    """Per op and step: calls, payload, ring and backend bytes, wire time, algbw, busbw, predicted time.

    Backend bytes and the prediction follow the collective that really ran (the trace's
    wire_op / wire_bytes): gloo's own reduce_scatter moves an all_reduce's bytes, the ring
    minidist.comm runs on gloo by default moves the ring minimum.
    """
    acc: dict[str, dict] = defaultdict(lambda: dict(calls=0, payload=0, sent=0, backend=0, wire_s=0.0,
                                                    predicted_s=0.0, busbw_num=0.0))
    for r, wire in zip(records, wire_times(records, arrived)):
        a, n = acc[r["op"]], r["group_size"]
        a["calls"] += 1
        a["payload"] += r["payload_bytes"]
        a["sent"] += r["sent_bytes"]
        a["backend"] += r["wire_bytes"]  # what ran: gloo's native reduce_scatter is an all_reduce, minidist's ring is not
        a["wire_s"] += wire
        a["predicted_s"] += cost.predict(r["wire_op"], r["payload_bytes"], n, "ring")
        a["busbw_num"] += r["payload_bytes"] * busbw_factor(r["op"], n)
    out = {}
    for op, a in sorted(acc.items()):
        wire = a["wire_s"]
        out[op] = {"calls": a["calls"] / steps, "payload_bytes": a["payload"] / steps, "sent_bytes": a["sent"] / steps,
                   "backend_bytes": a["backend"] / steps, "wire_s": wire / steps,
                   "predicted_s": a["predicted_s"] / steps,
                   "algbw_GBps": a["payload"] / wire / 1e9 if wire > 0 else None,
                   "busbw_GBps": a["busbw_num"] / wire / 1e9 if wire > 0 else None}
    return out


def time_split(raw: dict) -> dict[str, float]:
    """Step, compute, exposed and hidden communication of one rank, summed over its measured steps."""
    windows: dict[int, list[float]] = {}
    for _, _, step, start, end in raw["phases"]:
        w = windows.setdefault(step, [start, end])
        w[0], w[1] = min(w[0], start), max(w[1], end)
    spans = [(r["issued"], r["completed"]) for r in raw["records"] if r["completed"] is not None]
    sync = [(r["issued"], r["completed"]) for r in raw["records"] if not r["async_op"] and r["completed"] is not None]
    blocked = intervals.union([(a, b) for _, a, b in raw["waits"]] + sync)
    comm = intervals.union(spans)
    out = dict.fromkeys(("step_s", "exposed_s", "comm_s", "hidden_s"), 0.0)
    for start, end in windows.values():
        b = intervals.clip(blocked, (start, end))
        c = intervals.clip(comm, (start, end))
        out["step_s"] += end - start
        out["exposed_s"] += intervals.length(b)
        out["comm_s"] += intervals.length(c)
        out["hidden_s"] += intervals.length(c) - intervals.length(intervals.intersect(c, b))
    out["compute_s"] = out["step_s"] - out["exposed_s"]
    return {k: v / max(1, len(windows)) for k, v in out.items()}


def _mean_split(raws: list[dict]) -> dict[str, float]:
    splits = [time_split(r) for r in raws]
    out = {k: sum(s[k] for s in splits) / len(splits) for k in splits[0]}
    out["hidden_share"] = out["hidden_s"] / out["comm_s"] if out["comm_s"] > 0 else None
    return out


def _memory(raws: list[dict], prof: StepProfile | None, strategy_cfg, optim: str) -> dict:
    measured = [r["memory"] for r in raws if r["memory"]]
    if not measured:
        return {}
    worst = max(range(len(measured)), key=lambda i: measured[i]["total"])
    out = {"measured": measured[worst] | {"rank": raws[worst]["rank"]}}
    if prof is not None:
        mesh = raws[0]["mesh"]
        shard = mesh["shape"][-1] if strategy_cfg.name == "hybrid_shard" else None
        est = estimate_memory(prof, strategy_cfg.name, raws[0]["world"], optimizer=optim, shard_size=shard,
                              backend=raws[0]["backend"], **_prefetch(strategy_cfg))
        out["predicted"] = {"total": est.total, "by_role": est.by_role, "where": est.where}
        out["error"] = est.total / measured[worst]["total"] - 1
    return out


def _prefetch(strategy_cfg) -> dict:
    keys = ("max_inflight_all_gathers", "forward_prefetch", "backward_prefetch")
    return {k: getattr(strategy_cfg, k) for k in keys if hasattr(strategy_cfg, k)}


def strategy_row(raws: list[dict], layout: Layout, cost: CostModel, prof: StepProfile | None, cfg,
                 strategy_cfg) -> dict:
    """One strategy's measured and predicted numbers (plain JSON; see the module docstring)."""
    r0, steps = raws[0], cfg.steps
    world, backend = r0["world"], r0["backend"]
    lay = dataclasses.replace(layout, bucket_numels=tuple(r0["bucket_numels"]) or layout.bucket_numels)
    shard = r0["mesh"]["shape"][-1] if strategy_cfg.name == "hybrid_shard" else None
    calls = plan(strategy_cfg.name, lay, world, shard, grad_clip=cfg.trainer.grad_clip > 0)
    ops = op_stats(r0["records"], steps, cost, backend, arrivals([r["records"] for r in raws])[0])
    return {
        "strategy": strategy_cfg.name, "world": world, "backend": backend, "mesh": r0["mesh"],
        "ops": ops,
        "payload_bytes": sum(o["payload_bytes"] for o in ops.values()),
        "ring_bytes": sum(o["sent_bytes"] for o in ops.values()),
        "ring_bytes_analytic": ring_bytes(calls), "closed_form": CLOSED_FORM.get(strategy_cfg.name, ""),
        "calls_analytic": len(calls),
        "backend_bytes": sum(o["backend_bytes"] for o in ops.values()),
        "comm_wire_s": sum(o["wire_s"] for o in ops.values()),
        "comm_predicted_s": sum(o["predicted_s"] for o in ops.values()),
        "time": _mean_split(raws),
        "memory": _memory(raws, prof, strategy_cfg, cfg.optim.name),
    }

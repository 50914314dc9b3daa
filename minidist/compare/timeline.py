"""The measured steps as a timeline: Chrome trace JSON (Perfetto, chrome://tracing) and a PNG.

    trace = chrome_trace(raws)          # raws: every rank's raw results, every strategy
    json.dump(trace, f); draw_png(raws, "timeline.png")

Layout of the trace: one process per rank (pid = rank, named "rank r"); thread "compute"
(tid 0) holds each step, inside it forward / backward / optimizer, inside those every wait of the
main thread on a collective (on its Work or its future: minidist.comm.trace), and between the
strategy's steps the plain model's (the no-communication baseline they alternate with); a pipeline
row has no forward / backward / optimizer phases (its micro-batches interleave them): its compute
thread holds the pipeline runtime's own record of each action (F0, B0, ... and each wait for a
message: Pipeline.timeline) instead; threads "comm", "comm 2", ... (tid 1, 2, ...) hold every collective from issue to
completion, a new lane whenever one is issued before the previous one finished (the format
wants the slices of one thread nested, and async collectives overlap). Complete events
(ph "X"), microseconds since the barrier that started the comparison; the ranks' clocks are
aligned at that barrier. The strategies ran one after the other, so they follow each other
along the time axis. In the PNG every strategy's panel starts at its first measured step and
all panels share one time axis, so their lengths compare.
"""

from __future__ import annotations

from pathlib import Path

OP_COLORS = {"all_reduce": "#d62728", "all_gather": "#9467bd", "reduce_scatter": "#8c564b",
             "broadcast": "#e377c2", "barrier": "#7f7f7f"}
PHASE_COLORS = {"forward": "#1f77b4", "backward": "#ff7f0e", "optimizer": "#2ca02c"}
PLAIN_COLOR = "#d9d9d9"
US = 1e6


def _x(name: str, cat: str, pid: int, tid: int, start: float, end: float, args: dict) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": start * US,
            "dur": max(0.0, end - start) * US, "args": args}


def _meta(pid: int, tid: int | None, what: str, name: str) -> dict:
    ev = {"name": what, "ph": "M", "pid": pid, "args": {"name": name}}
    return ev | ({"tid": tid} if tid is not None else {})


def _lanes(records: list[dict]) -> list[int]:
    """A comm lane per record, so that records in one lane never overlap."""
    ends: list[float] = []
    lanes = [0] * len(records)
    for i in sorted(range(len(records)), key=lambda i: records[i]["issued"]):
        r = records[i]
        end = r["completed"] if r["completed"] is not None else r["issued"]
        lane = next((k for k, e in enumerate(ends) if e <= r["issued"]), len(ends))
        if lane == len(ends):
            ends.append(end)
        ends[lane] = end
        lanes[i] = lane
    return lanes


def _compute_events(raw: dict, pid: int) -> list[dict]:
    strategy = raw["strategy"]
    events = [_x(phase, "phase", pid, 0, start, end, {"strategy": strategy, "step": step})
              for phase, step, start, end in raw["phases"]]
    events += [_x(f"{strategy} step {i}", "step", pid, 0, start, end, {"strategy": strategy})
               for i, (start, end) in enumerate(raw["steps"])]
    events += [_x("wait", "wait", pid, 0, start, end, {"strategy": strategy}) for start, end in raw["main_waits"]]
    events += [_x(f"plain {phase}", "baseline", pid, 0, start, end, {"strategy": strategy, "step": step})
               for phase, step, start, end in raw.get("baseline", {}).get("phases", [])]
    events += [_x(what, "pipeline", pid, 0, start, end, {"strategy": strategy, "step": step, "kind": kind})
               for what, kind, step, start, end in pipeline_actions(raw)]
    return events


def pipeline_actions(raw: dict) -> list[tuple[str, str, int, float, float]]:
    """A pipeline row's (label, kind, step, start, end) per action of its measured steps (the runtime's timeline):
    kind "forward" (F), "backward" (B, BI, BW) or "wait" (for a message); none for any other row."""
    return [(what, "wait" if what == "wait" else "forward" if what.startswith("F") else "backward", step, a, b)
            for step, tl in enumerate((raw.get("pp") or {}).get("timelines", [])) for what, a, b in tl]


def _comm_events(raw: dict, pid: int) -> tuple[list[dict], int]:
    records = raw["records"]
    lanes = _lanes(records)
    events = []
    for r, lane in zip(records, lanes):
        end = r["completed"] if r["completed"] is not None else r["issued"]
        args = {k: r[k] for k in ("strategy", "group", "group_size", "dtype", "payload_bytes", "sent_bytes",
                                  "async_op", "completion")}
        events.append(_x(r["op"], "comm", pid, 1 + lane, r["issued"], end, args))
    return events, max(lanes, default=-1) + 1


def chrome_trace(raws: list[dict]) -> dict:
    """Every rank's events of every strategy, merged: {"traceEvents": [...]} (see module docstring)."""
    events: list[dict] = []
    lanes: dict[int, int] = {}
    for raw in raws:
        pid = raw["rank"]
        events += _compute_events(raw, pid)
        comm, n = _comm_events(raw, pid)
        events += comm
        lanes[pid] = max(lanes.get(pid, 0), n)
    for pid in sorted(lanes):
        events += [_meta(pid, None, "process_name", f"rank {pid}"), _meta(pid, 0, "thread_name", "compute")]
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}})
        events += [_meta(pid, 1 + k, "thread_name", "comm" if k == 0 else f"comm {k + 1}") for k in range(lanes[pid])]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def draw_png(raws: list[dict], path: Path) -> Path:
    """One panel per strategy; per rank a compute row (phases, waits in black) and a comm row."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    strategies = list(dict.fromkeys(r["strategy"] for r in raws))
    ranks = sorted({r["rank"] for r in raws})
    fig, axes = plt.subplots(len(strategies), 1, figsize=(12, 1.0 + 0.9 * len(ranks) * len(strategies)), squeeze=False,
                             sharex=True)
    for ax, strategy in zip(axes[:, 0], strategies):
        mine = [r for r in raws if r["strategy"] == strategy]
        t0 = min(r["steps"][0][0] for r in mine)
        for raw in mine:
            _draw_rank(ax, raw, t0, 2 * (len(ranks) - 1 - ranks.index(raw["rank"])))
        ax.set_yticks([2 * i + off for i in range(len(ranks)) for off in (0.4, 1.4)])
        ax.set_yticklabels([f"rank {r} {row}" for r in reversed(ranks) for row in ("comm", "compute")], fontsize=7)
        ax.set_title(strategy, fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("ms since the strategy's first measured step (one axis for every panel)", fontsize=8)
    handles = [Patch(color=c, label=k) for k, c in (PHASE_COLORS | OP_COLORS).items()] + [
        Patch(color="black", label="wait"), Patch(color=PLAIN_COLOR, label="plain model's step (no communication)")]
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=6)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw_rank(ax, raw: dict, t0: float, y: float) -> None:
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    for phase, _, start, end in raw["phases"]:
        ax.broken_barh([(ms(start), ms(end) - ms(start))], (y + 1.05, 0.7), color=PHASE_COLORS[phase])
    plain = [(ms(a), ms(b) - ms(a)) for _, _, a, b in raw.get("baseline", {}).get("phases", [])]
    ax.broken_barh(plain, (y + 1.05, 0.7), color=PLAIN_COLOR)
    for _, kind, _, start, end in pipeline_actions(raw):  # a pipeline's actions; its waits as the main thread's
        ax.broken_barh([(ms(start), ms(end) - ms(start))], (y + 1.05, 0.7 if kind != "wait" else 0.25),
                       color=PHASE_COLORS.get(kind, "black"))
    waits = [(ms(a), ms(b) - ms(a)) for a, b in raw["main_waits"]]
    ax.broken_barh(waits, (y + 1.05, 0.25), color="black")
    for r in raw["records"]:
        end = r["completed"] if r["completed"] is not None else r["issued"]
        ax.broken_barh([(ms(r["issued"]), ms(end) - ms(r["issued"]))], (y + 0.05, 0.7),
                       color=OP_COLORS.get(r["op"], "gray"), alpha=0.55)


PROBE_COLORS = {"hook": "#7f7f7f", "launch": "#d62728", "gather": "#9467bd", "wait": "black", "callback": "#17becf"}
"""draw_step's engine row: a gradient hook, a collective's launch, a gather started, a wait,
the end-of-backward callback."""
OP_ABBREV = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "broadcast": "BC"}


def draw_step(ranks: list[dict], path: Path, title: str, moments: list[tuple[float, str, str]]) -> Path:
    """One traced step of one engine, rank by rank, with numbered moments (recipes/traced_step.py).

    ranks[i]: {"rank", "phases": [(phase, start, end)], "compute": [(phase, start, end)] (the emulated
    compute), "probes": [(kind, label, start, end)] (the engine's own work, PROBE_COLORS), "records":
    [{"op", "issued", "completed", "bytes"}]}, perf_counter seconds on one clock. Per rank, top to
    bottom: a compute row (each phase as a pale band, the sleeping layers solid), an engine row and
    one comm lane per overlapping collective (_lanes). moments: (time, row, text) on rank 0's rows
    ("compute", "engine" or "comm"), drawn as circled numbers 1, 2, ... in list order.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ranks = sorted(ranks, key=lambda r: r["rank"])
    t0 = min(p[1] for r in ranks for p in r["phases"])
    ms = lambda t: (t - t0) * 1e3  # noqa: E731
    lanes = [_lanes(r["records"]) for r in ranks]
    span = max(ms(p[2]) for r in ranks for p in r["phases"])
    heights = [2 + max(ls, default=-1) + 1 for ls in lanes]
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.36 * (sum(heights) + len(ranks))))
    ticks, labels, rows0 = [], [], {}
    y = 0.0
    for raw, ls, h in zip(ranks, lanes, heights):
        top = y + h
        rows = _draw_step_rank(ax, raw, ls, top, ms, span)
        ticks += [rows["compute"] + 0.5, rows["engine"] + 0.5] + [top - 3 - k + 0.5 for k in range(h - 2)]
        labels += [f"rank {raw['rank']} compute", "engine"] + ["comm" if k == 0 else f"comm {k + 1}" for k in range(h - 2)]
        if raw["rank"] == ranks[0]["rank"]:
            rows0 = rows
        y = top + 1
    _draw_moments(ax, moments, rows0, ms, span)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_ylim(-0.3, y + 0.6)
    ax.set_xlabel("ms since the step started", fontsize=8)
    ax.set_title(title, fontsize=9, loc="left")
    kinds = {e[0] for r in ranks for e in r["probes"]}
    ops = {rec["op"] for r in ranks for rec in r["records"]}
    handles = ([Patch(color=c, label=k) for k, c in PHASE_COLORS.items()]
               + [Patch(color=c, label=k) for k, c in PROBE_COLORS.items() if k in kinds]
               + [Patch(color=c, alpha=0.6, label=f"{k} ({OP_ABBREV[k]})") for k, c in OP_COLORS.items() if k in ops])
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1), fontsize=7, ncol=(len(handles) + 1) // 2,
              frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _draw_step_rank(ax, raw: dict, lanes: list[int], top: float, ms, span: float) -> dict[str, float]:
    """One rank's rows below `top`: compute (phases pale, sleeping layers solid), engine, comm lanes.
    Returns each row's bottom y."""
    rows = {"compute": top - 1, "engine": top - 2, "comm": top - 3}
    for phase, a, b in raw["phases"]:
        ax.broken_barh([(ms(a), ms(b) - ms(a))], (rows["compute"] + 0.05, 0.9), color=PHASE_COLORS[phase], alpha=0.2)
    for phase, a, b in raw["compute"]:
        ax.broken_barh([(ms(a), ms(b) - ms(a))], (rows["compute"] + 0.2, 0.6), color=PHASE_COLORS[phase])
    for kind, _, a, b in sorted(raw["probes"], key=lambda e: e[2] - e[3]):  # nested calls drawn over their callers
        ax.broken_barh([(ms(a), max(ms(b) - ms(a), 0.25))], (rows["engine"] + 0.15, 0.7), color=PROBE_COLORS[kind])
    for rec, lane in zip(raw["records"], lanes):
        a, b = ms(rec["issued"]), ms(rec["completed"] if rec["completed"] is not None else rec["issued"])
        ly = rows["comm"] - lane
        ax.broken_barh([(a, b - a)], (ly + 0.1, 0.8), color=OP_COLORS.get(rec["op"], "gray"), alpha=0.6)
        ax.text(a + 0.004 * span, ly + 0.5, OP_ABBREV.get(rec["op"], rec["op"]), fontsize=6, va="center",
                clip_on=True)
    return rows


def _draw_moments(ax, moments: list[tuple[float, str, str]], rows: dict[str, float], ms, span: float) -> None:
    """Circled numbers 1, 2, ... on rank 0's rows; a moment close to an earlier one is raised a level."""
    placed: list[tuple[float, int]] = []
    for n, (t, row, _) in enumerate(moments, 1):
        level = next(k for k in range(len(moments) + 1)
                     if all(abs(ms(t) - x) > 0.025 * span or k != lv for x, lv in placed))
        placed.append((ms(t), level))
        yy = rows[row] + 0.5
        ax.annotate(str(n), xy=(ms(t), yy), xytext=(ms(t), yy + 0.8 + 0.55 * (level % 3)), fontsize=7, ha="center",
                    bbox=dict(boxstyle="circle,pad=0.15", fc="white", ec="black", lw=0.6),
                    arrowprops=dict(arrowstyle="-", lw=0.6))

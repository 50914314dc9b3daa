"""The comparison as tables: printed (fits 120 columns), Markdown (table.md), CSV and JSON.

Four tables, a row per strategy: communication (bytes per step and rank), time, memory, and
bandwidth per collective. The terminal gets the first three; table.md all four, each with its
legend; table.csv every number flat; results.json the rows as they are. Units: MB = 1e6 bytes
and GB/s (nccl-tests' convention), MiB for memory, ms. What each number is: analysis.py.
"""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path
from typing import Callable

from minidist.footprint import ROLES

OP_ABBREV = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "broadcast": "BC", "barrier": "BR",
             "reduce": "RD", "all_to_all": "A2A", "gather": "GA", "scatter": "SC"}
MB, MIB = 1e6, 2 ** 20
ROLE_HEADERS = {"parameters": "params", "gradients": "grads", "optimizer": "optim", "buffers": "buffers",
                "activations": "activ", "other": "other"}
Column = tuple[str, Callable[[dict, float], str]]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _mb(x) -> str:
    return "not measured" if x is None else f"{x / MB:.3f}"


def _ms(s: dict) -> str:
    """median [p25-p75] of a spread, in ms."""
    return f"{s['median'] * 1e3:.1f} [{s['p25'] * 1e3:.0f}-{s['p75'] * 1e3:.0f}]"


def _calls(r: dict) -> str:
    """Calls per step by op; sends and receives together as P2P (a pipeline's or a ring's messages)."""
    calls = {OP_ABBREV.get(op, op): n for op, n in r["calls"].items() if op not in ("send", "recv")}
    p2p = sum(n for op, n in r["calls"].items() if op in ("send", "recv"))
    return " ".join(f"{op}{n:g}" for op, n in sorted(calls.items()) + ([("P2P", p2p)] if p2p else [])) or "-"


def _mem(r: dict, key: str, role: str | None = None) -> str:
    m = r["memory"]
    if not m:
        return "-"
    if key == "estimate":
        m = m.get("estimate")
        return "not estimated" if m is None else f"{(m['by_role'][role] if role else m['total']) / MIB:.2f}"
    return f"{(m['by_role'][role] if role else m[key]) / MIB:.2f}"


def _bubble(r: dict) -> str:
    """A pipeline row's measured bubble and (p-1)/(m+p-1) (or its schedule's formula) beside it; "-" otherwise."""
    b = (r.get("pp") or {}).get("bubble")
    return "-" if b is None else f"{b['measured']:.2f} ({b['formula']:.2f})"


def _bw(r: dict, which: str) -> str:
    ops = r["alone"]["ops"]
    return " ".join(f"{OP_ABBREV.get(op, op)} {o[which]:.2f}" for op, o in sorted(ops.items())
                    if o[which] is not None and o["payload"] >= 1024) or "-"


COMMUNICATION: list[Column] = [
    ("strategy", lambda r, d: r["strategy"]),
    ("calls/step", lambda r, d: _calls(r)),
    ("ring MB", lambda r, d: _mb(r["bytes"]["trace"])),
    ("wire MB", lambda r, d: _mb(r["bytes"]["wire"])),
    ("kernel MB", lambda r, d: _mb(r["bytes"]["kernel"])),
    ("kernel/wire", lambda r, d: _pct(r["bytes"]["kernel_error"])),
    ("analytic MB", lambda r, d: _mb(r["bytes"]["formula"])),
    ("formula", lambda r, d: r["closed_form"]),
    ("x DDP", lambda r, d: f"{r['bytes']['trace'] / d:.2f}" if d else "-"),
]
TIME: list[Column] = [
    ("strategy", lambda r, d: r["strategy"]),
    ("step ms", lambda r, d: _ms(r["time"]["step"])),
    ("plain ms", lambda r, d: _ms(r["time"]["baseline"])),
    ("overhead", lambda r, d: f"{r['time']['overhead'] * 1e3:.1f}"),
    ("alone ms", lambda r, d: f"{r['time']['alone'] * 1e3:.1f}"),
    ("hidden", lambda r, d: _pct(r["time"]["hidden"]).lstrip("+")),
    ("a-b ms", lambda r, d: f"{r['time']['predicted'] * 1e3:.1f}"),
    ("a-b error", lambda r, d: _pct(r["time"]["predicted_error"])),
    ("blocked ms", lambda r, d: f"{r['time']['blocked'] * 1e3:.1f}"),
    ("bubble (formula)", lambda r, d: _bubble(r)),
]
TIME_MORE: list[Column] = [
    ("strategy", lambda r, d: r["strategy"]),
    ("in-step wire ms", lambda r, d: f"{r['time']['in_step_wire'] * 1e3:.1f}"),
    ("alone ms", lambda r, d: f"{r['time']['alone'] * 1e3:.1f}"),
    ("plain forward ms", lambda r, d: f"{r['time']['baseline_phases'].get('forward', 0) * 1e3:.1f}"),
    ("plain backward ms", lambda r, d: f"{r['time']['baseline_phases'].get('backward', 0) * 1e3:.1f}"),
]
MEMORY: list[Column] = [
    ("strategy", lambda r, d: r["strategy"]),
    ("peak MiB", lambda r, d: _mem(r, "allocator")),
    ("estimate", lambda r, d: _mem(r, "estimate")),
    ("error", lambda r, d: _pct(r["memory"].get("error")) if r["memory"] else "-"),
    ("ledger", lambda r, d: _mem(r, "ledger")),
] + [(ROLE_HEADERS[role], lambda r, d, role=role: _mem(r, "by_role", role)) for role in ROLES] + [
    ("at", lambda r, d: r["memory"].get("where", "-") if r["memory"] else "-"),
]
BANDWIDTH: list[Column] = [
    ("strategy", lambda r, d: r["strategy"]),
    ("algbw GB/s", lambda r, d: _bw(r, "algbw_GBps")),
    ("busbw GB/s", lambda r, d: _bw(r, "busbw_GBps")),
    ("repeats", lambda r, d: str(r["alone"]["repeats"])),
]
TABLES = {"communication per step and rank (mean over ranks)": COMMUNICATION,
          "time per step (median [interquartile range] of the measured steps)": TIME,
          "peak memory per rank (the rank with the largest)": MEMORY,
          "communication inside the step, and the plain step's phases": TIME_MORE,
          "bandwidth of each collective alone (nccl-tests' algbw and busbw)": BANDWIDTH}
LEGENDS = {
    "communication per step and rank (mean over ranks)":
        "calls: AR all_reduce, AG all_gather, RS reduce_scatter, BC broadcast, P2P point-to-point sends and receives. ring: the ring formula's bytes "
        "(minidist.comm.trace) of the calls the trace recorded, a formula, not a measurement (a broadcast is sent by "
        "N-1 of N ranks, S(N-1)/N on average; kernel is the measurement); wire: the same for the collective "
        "the backend really runs (gloo's own reduce_scatter is an all_reduce); kernel: what the kernel counted this "
        "process writing (/proc/self/io, gloo only: NCCL's bytes are not measured); kernel/wire: their difference "
        "(gloo's message headers); analytic: the same formulas applied call by call to the model's predicted call "
        "list (padding included; equal to ring when the calls are the predicted ones); formula: their closed form (S parameter bytes, G shard group, R replicas; a tensor-parallel "
        "row <strategy>+tp<T>: TP's term, L blocks of width h, b sequences of s tokens per tp group, e bytes per "
        "element, plus the strategy's over a rank's slices S_T and the D = N / T data-parallel ranks; a "
        "context-parallel row <strategy>+cp<C>: the ring's term (minidist.cp.cost), b sequences of s tokens per cp "
        "group, plus the strategy's over all N ranks; a pipeline row <strategy>+pp<P>: its point-to-point "
        "messages, 2bshe(P-1)/P for b sequences of s tokens per pipeline, plus the strategy's over a stage's S_P and "
        "its D = N / P data-parallel ranks); x DDP: "
        "ring bytes over DDP's.",
    "time per step (median [interquartile range] of the measured steps)":
        "step: the trainer's step, the slowest rank; plain: the same step of the plain model (no wrapper, no "
        "communication); overhead: step - plain; alone: the step's collectives run alone, one at a time; hidden: "
        "1 - overhead / alone (minidist.comm.trace.hidden_share; below 0 when the engine's own work costs more "
        "than the communication it hides); a-b: the alpha-beta ring prediction with the calibrated alpha and beta, "
        "its error against alone; blocked: main-thread time inside collective calls and waits; bubble: a pipeline "
        "row's share of the step its ranks spend not computing, measured from the runtime's own timeline "
        "(Pipeline.timeline: 1 - compute / (P x span), the median over steps), beside its schedule's formula "
        "(minidist.pp.cost.bubble: (P-1)/(m+P-1) for 1F1B and GPipe, m = pp_microbatches).",
    "peak memory per rank (the rank with the largest)":
        "peak: the allocator's peak, the higher of two steps (the instrument is named in the header); estimate: "
        "minidist.compare.estimate, nothing run (not estimated for tensor-parallel rows: the engines' "
        "footprints describe data parallelism only); error: estimate / peak - 1; ledger: live tensor bytes the "
        "ledger (minidist.compare.memory) saw at its own peak, split by role (MiB); at: the phase of that peak.",
    "communication inside the step, and the plain step's phases":
        "in-step wire: the trace's estimate of the time the step's collectives spent on the wire inside the "
        "measured steps (from the last rank's issue to completion, queueing behind the group's previous "
        "collective removed: minidist.comm.trace.wire_times), the mean over ranks; against alone, what running "
        "inside the step costs. plain forward / backward: the phases of the step without communication (what "
        "the projection holds the communication against).",
    "bandwidth of each collective alone (nccl-tests' algbw and busbw)":
        "algbw = payload / time, busbw = algbw x 2(n-1)/n (AR), (n-1)/n (AG, RS), 1 (BC), each call timed alone "
        "after a barrier, the median of the repeats, the mean over ranks; per op, summed payload over summed time.",
}


def _cells(rows: list[dict], cols: list[Column], ddp: float) -> tuple[list[str], list[list[str]]]:
    return [h for h, _ in cols], [[fn(r, ddp) for _, fn in cols] for r in rows]


def table_text(rows: list[dict], ddp: float, cols: list[Column]) -> str:
    """One table as aligned text."""
    head, cells = _cells(rows, cols, ddp)
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    fmt = lambda xs: " ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(xs, widths)))  # noqa: E731
    return "\n".join([fmt(head), "-" * len(fmt(head))] + [fmt(c) for c in cells])


def notes(rows: list[dict]) -> list[str]:
    return [f"{r['strategy']}: {r['note']}" for r in rows if r.get("note")]


def _short_formula(r: dict) -> str:
    """The formula cell as printed: a tensor- (context-, pipeline-) parallel row's TP (CP, PP) term so (its note
    spells it out)."""
    short = r["closed_form"]
    for dim in ("tp", "cp", "pp"):
        short = short.replace(r[dim]["term"], dim.upper()) if r.get(dim) else short
    return short


def terminal(rows: list[dict], ddp: float) -> str:
    """What the recipe prints: the first three tables (each within 120 columns) and the notes, wrapped."""
    short = lambda cols: [("formula", lambda r, d: _short_formula(r)) if h == "formula" else (h, fn)  # noqa: E731
                          for h, fn in cols]
    parts = [f"{title}:\n{table_text(rows, ddp, short(cols))}" for title, cols in list(TABLES.items())[:3]]
    below = [r for r in rows if (r["time"]["hidden"] or 0) < 0]
    if below:  # the time table's one column that reads wrong without its definition
        worst = min(below, key=lambda r: r["time"]["hidden"])
        parts[1] += "\n" + "\n".join(textwrap.wrap(
            f"hidden = 1 - overhead / alone: 100% = all communication hidden behind compute, 0% = none. Below 0 "
            f"({worst['strategy']} {_pct(worst['time']['hidden'])}): the step lost more time than its collectives take "
            f"run alone: nothing was hidden, and the engine's own work (hooks, copies, waits) and, on a CPU, the "
            f"backend's threads taking cores from the compute cost the rest.",
            120))
    wrapped = ["\n".join(textwrap.wrap(n, 120, subsequent_indent="  ")) for n in notes(rows)]
    return "\n\n".join(parts + ["\n".join(wrapped)] if wrapped else parts)


def table_markdown(rows: list[dict], ddp: float, header: str) -> str:
    out = [header]
    for title, cols in TABLES.items():
        head, cells = _cells(rows, cols, ddp)
        out += ["", f"**{title[0].upper() + title[1:]}**", "", "| " + " | ".join(head) + " |",
                "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
        out += ["| " + " | ".join(c) + " |" for c in cells]
        out += ["", LEGENDS[title]]
    return "\n".join(out + [""] + [f"- {n}" for n in notes(rows)])


def flat_row(row: dict) -> dict:
    """Every number of a row as one flat dict (the CSV line)."""
    out = {k: row[k] for k in ("strategy", "world", "backend", "closed_form", "note")}
    out |= {f"calls_{op}": n for op, n in row["calls"].items()}
    out |= {f"tp_{k}": v for k, v in (row.get("tp") or {}).items()}  # a tensor-parallel row's degree, dp, slices
    out |= {f"cp_{k}": v for k, v in (row.get("cp") or {}).items()}  # a context-parallel row's degree, rotation
    out |= {f"bytes_{k}": v for k, v in row["bytes"].items() if k != "kernel_per_rank"}
    for key in ("step", "baseline"):
        out |= {f"time_{key}_{k}": v for k, v in row["time"][key].items()}
    out |= {f"time_{k}": v for k, v in row["time"].items() if not isinstance(v, dict)}
    for op, o in row["alone"]["ops"].items():
        out |= {f"alone_{op}_{k}": v for k, v in o.items()}
    m = row["memory"]
    if m:
        out |= {f"mem_{k}": m[k] for k in ("allocator", "ledger", "where", "error", "ledger_error") if k in m}
        out |= {f"mem_ledger_{role}": v for role, v in m["by_role"].items()}
        if m.get("estimate"):
            out["mem_estimate"] = m["estimate"]["total"]
            out |= {f"mem_estimate_{role}": v for role, v in m["estimate"]["by_role"].items()}
    return out


def write_tables(run_dir: Path, rows: list[dict], ddp: float, header: str, extra: dict) -> list[Path]:
    """table.md, table.csv and results.json in run_dir."""
    md = run_dir / "table.md"
    md.write_text(table_markdown(rows, ddp, header) + "\n")
    flat = [flat_row(r) for r in rows]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    path_csv = run_dir / "table.csv"
    with open(path_csv, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(flat)
    path_json = run_dir / "results.json"
    path_json.write_text(json.dumps({"rows": rows, **extra}, indent=1, default=str))
    return [md, path_csv, path_json]

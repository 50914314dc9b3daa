"""The comparison table: one row per strategy, printed and saved as Markdown, CSV and JSON.

Units: communication in MB (1e6 bytes) per step and GB/s (nccl-tests' convention); memory
in MiB; times in ms. Column meanings are in minidist.compare.analysis and the legend that
table_markdown() writes under the table.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable

from minidist.compare.memory import ROLES

OP_ABBREV = {"all_reduce": "AR", "all_gather": "AG", "reduce_scatter": "RS", "broadcast": "BC", "barrier": "BR",
             "reduce": "RD", "all_to_all": "A2A", "gather": "GA", "scatter": "SC"}
MB, MIB = 1e6, 2 ** 20
ROLE_HEADERS = {"parameters": "params", "gradients": "grads", "optimizer": "optim", "buffers": "buffers",
                "activations": "activ", "other": "other"}


def _calls(row: dict) -> str:
    return " ".join(f"{OP_ABBREV.get(op, op)}{o['calls']:g}" for op, o in row["ops"].items()) or "-"


def _bw(row: dict) -> str:
    parts = [f"{OP_ABBREV.get(op, op)} {o['algbw_GBps']:.2f}/{o['busbw_GBps']:.2f}"
             for op, o in row["ops"].items() if o["algbw_GBps"] is not None and o["payload_bytes"] >= 1024]
    return " ".join(parts) or "-"


def _backend_note(row: dict) -> str:
    if row["backend_bytes"] == row["ring_bytes"]:
        return "same"
    if row["backend"] == "gloo" and "reduce_scatter" in row["ops"]:
        return f"{row['backend_bytes'] / MB:.2f} (gloo's native RS = AR)"
    return f"{row['backend_bytes'] / MB:.2f}"


def _mem(row: dict, which: str, role: str | None = None) -> str:
    m = row["memory"].get(which)
    if not m:
        return "-"
    return f"{(m['by_role'][role] if role else m['total']) / MIB:.2f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%" if x < 0 or x > 0 else "0.0%"


COLUMNS: list[tuple[str, Callable[[dict, float], str]]] = [
    ("strategy", lambda r, d: r["strategy"]),
    ("calls/step", lambda r, d: _calls(r)),
    ("payload MB", lambda r, d: f"{r['payload_bytes'] / MB:.2f}"),
    ("ring MB/rank", lambda r, d: f"{r['ring_bytes'] / MB:.3f}"),
    ("analytic", lambda r, d: f"{r['ring_bytes_analytic'] / MB:.3f}"),
    ("formula", lambda r, d: r["closed_form"]),
    ("x DDP", lambda r, d: f"{r['ring_bytes'] / d:.2f}" if d else "-"),
    ("backend MB/rank", lambda r, d: _backend_note(r)),
    ("algbw/busbw GB/s", lambda r, d: _bw(r)),
    ("comm ms", lambda r, d: f"{r['comm_wire_s'] * 1e3:.1f}"),
    ("a-b ms", lambda r, d: f"{r['comm_predicted_s'] * 1e3:.1f}"),
    ("step ms", lambda r, d: f"{r['time']['step_s'] * 1e3:.1f}"),
    ("compute ms", lambda r, d: f"{r['time']['compute_s'] * 1e3:.1f}"),
    ("exposed ms", lambda r, d: f"{r['time']['exposed_s'] * 1e3:.1f}"),
    ("hidden", lambda r, d: "-" if r["time"]["hidden_share"] is None else f"{100 * r['time']['hidden_share']:.0f}%"),
] + [(ROLE_HEADERS[role], lambda r, d, role=role: _mem(r, "measured", role)) for role in ROLES] + [
    ("peak MiB", lambda r, d: _mem(r, "measured")),
    ("predicted", lambda r, d: _mem(r, "predicted")),
    ("error", lambda r, d: _pct(r["memory"].get("error"))),
]

LEGEND = """\
Per optimizer step. calls: AR all_reduce, AG all_gather, RS reduce_scatter, BC broadcast. payload: S summed over
calls (full logical tensors). ring MB/rank: bytes one rank sends under the ring model, counted by the trace
(rank 0); analytic: the formula applied call by call to the model's layout (padding included); formula: its
closed form (S = parameter bytes, padded per unit for FSDP; G shard group, R replicas). x DDP: ring bytes over
DDP's. backend: what the backend really moves where it differs. algbw = payload / wire time, busbw = algbw x
2(n-1)/n (AR), (n-1)/n (AG, RS), 1 (BC): nccl-tests' definitions; wire time excludes time queued behind an earlier
collective of the same group. comm ms: summed wire time; a-b ms: alpha-beta (ring) prediction with the
calibrated alpha and beta, for the op the backend runs. step = compute + exposed (time blocked waiting on
communication); hidden: share of the time communicating that the main thread spent computing (HTA's overlap).
Memory: per-rank peak of live tensor bytes (the rank with the largest), split by role at that instant (MiB);
predicted: minidist.compare.estimate; error: predicted / measured - 1.
"""


def rows_as_cells(rows: list[dict], ddp_bytes: float) -> list[list[str]]:
    return [[fn(row, ddp_bytes) for _, fn in COLUMNS] for row in rows]


def table_text(rows: list[dict], ddp_bytes: float) -> str:
    """The table as aligned text (what the recipe prints)."""
    head = [h for h, _ in COLUMNS]
    cells = rows_as_cells(rows, ddp_bytes)
    widths = [max(len(x) for x in col) for col in zip(head, *cells)]
    fmt = lambda xs: "  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(xs, widths)))  # noqa: E731
    return "\n".join([fmt(head), "-" * len(fmt(head))] + [fmt(c) for c in cells])


def table_markdown(rows: list[dict], ddp_bytes: float, header: str) -> str:
    head = [h for h, _ in COLUMNS]
    lines = [header, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(c) + " |" for c in rows_as_cells(rows, ddp_bytes)]
    return "\n".join(lines + ["", LEGEND])


def flat_row(row: dict) -> dict:
    """Every number of a row as one flat dict (the CSV line)."""
    out = {k: row[k] for k in ("strategy", "world", "backend", "payload_bytes", "ring_bytes", "ring_bytes_analytic",
                               "closed_form", "backend_bytes", "comm_wire_s", "comm_predicted_s")}
    out |= {f"time_{k}": v for k, v in row["time"].items()}
    for op, o in row["ops"].items():
        out |= {f"{op}_{k}": v for k, v in o.items()}
    for which in ("measured", "predicted"):
        m = row["memory"].get(which)
        if m:
            out[f"mem_{which}_total"] = m["total"]
            out[f"mem_{which}_where"] = m["where"]
            out |= {f"mem_{which}_{role}": v for role, v in m["by_role"].items()}
    out["mem_error"] = row["memory"].get("error")
    return out


def write_tables(run_dir: Path, rows: list[dict], ddp_bytes: float, header: str, extra: dict) -> list[Path]:
    """table.md, table.csv and results.json in run_dir."""
    md = run_dir / "table.md"
    md.write_text(table_markdown(rows, ddp_bytes, header) + "\n")
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

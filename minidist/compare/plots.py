"""The comparison as one PNG: bytes, memory and time per strategy, measured beside predicted."""

from __future__ import annotations

from pathlib import Path

from minidist.compare.memory import ROLES

MB, MIB = 1e6, 2 ** 20
ROLE_COLORS = {"parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer": "#2ca02c", "buffers": "#d62728",
               "activations": "#9467bd", "other": "#8c8c8c"}


def _bytes_panel(ax, rows: list[dict]) -> None:
    x = range(len(rows))
    w = 0.27
    series = (("measured (trace)", "ring_bytes", "#1f77b4"), ("analytic", "ring_bytes_analytic", "#aec7e8"),
              ("backend moves", "backend_bytes", "#ff7f0e"))
    for k, (label, key, color) in enumerate(series):
        ax.bar([i + (k - 1) * w for i in x], [r[key] / MB for r in rows], w, label=label, color=color)
    ax.set_ylabel("MB sent per rank per step")
    ax.set_title("communication", fontsize=9)


def _memory_panel(ax, rows: list[dict]) -> None:
    bottoms = [0.0] * len(rows)
    for role in ROLES:
        vals = [r["memory"]["measured"]["by_role"][role] / MIB if r["memory"].get("measured") else 0 for r in rows]
        ax.bar(range(len(rows)), vals, 0.6, bottom=bottoms, label=role, color=ROLE_COLORS[role])
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    pred = [(i, r["memory"]["predicted"]["total"] / MIB) for i, r in enumerate(rows) if r["memory"].get("predicted")]
    if pred:
        ax.scatter(*zip(*pred), marker="_", s=600, color="black", label="predicted", zorder=3)
    ax.set_ylabel("peak MiB per rank")
    ax.set_title("memory at the peak", fontsize=9)


def _time_panel(ax, rows: list[dict]) -> None:
    x = range(len(rows))
    compute = [r["time"]["compute_s"] * 1e3 for r in rows]
    exposed = [r["time"]["exposed_s"] * 1e3 for r in rows]
    ax.bar(x, compute, 0.6, label="compute", color="#2ca02c")
    ax.bar(x, exposed, 0.6, bottom=compute, label="exposed comm", color="#d62728")
    ax.scatter(x, [r["comm_predicted_s"] * 1e3 for r in rows], marker="x", color="black", label="a-b comm", zorder=3)
    ax.scatter(x, [r["comm_wire_s"] * 1e3 for r in rows], marker="o", facecolors="none", edgecolors="black",
               label="comm (wire)", zorder=3)
    ax.set_ylabel("ms per step")
    ax.set_title("time", fontsize=9)


def draw_comparison(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 5.2))
    for ax, panel in zip(axes, (_bytes_panel, _memory_panel, _time_panel)):
        panel(ax, rows)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r["strategy"] for r in rows], rotation=20, fontsize=8)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

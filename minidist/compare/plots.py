"""The comparison as PNGs: bytes, memory and time per strategy, each measured beside its prediction
(draw_comparison); communication per step at many ranks (draw_projection)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from minidist.compare.projection import Cluster
from minidist.footprint import ROLES

MB, MIB = 1e6, 2 ** 20
ROLE_COLORS = {"parameters": "#1f77b4", "gradients": "#ff7f0e", "optimizer": "#2ca02c", "buffers": "#d62728",
               "activations": "#9467bd", "other": "#8c8c8c"}


def _bytes_panel(ax, rows: list[dict]) -> None:
    series = (("trace (ring model)", "trace", "#1f77b4"), ("backend runs", "wire", "#aec7e8"),
              ("kernel counted", "kernel", "#ff7f0e"), ("formulas, call by call", "formula", "#7f7f7f"))
    w = 0.8 / len(series)
    for k, (label, key, color) in enumerate(series):
        vals = [(i + (k - 1.5) * w, r["bytes"][key] / MB) for i, r in enumerate(rows) if r["bytes"][key] is not None]
        if vals:
            ax.bar(*zip(*vals), w, label=label, color=color)
    if not any(r["bytes"]["trace"] for r in rows):  # a world of one: every bar is 0 (an axis of -0.04..0.04 else)
        ax.set_ylim(0, 1)
        ax.text(0.5, 0.5, f"world {rows[0]['world']}: nothing sent\n(run at 2 or more ranks)", ha="center",
                va="center", transform=ax.transAxes, fontsize=9)
    ax.set_ylabel("MB sent per rank per step (mean over ranks)")
    ax.set_title("communication", fontsize=9)


THIN = 0.005
"""A role below this share of the tallest bar everywhere is not drawn (nor listed in the legend)."""
UNSEEN = 0.05
"""A peak this much above its ledger's bar is labelled with the difference (what no role was seen to hold)."""


def _memory_panel(ax, rows: list[dict]) -> None:
    bottoms = [0.0] * len(rows)
    tallest = max((r["memory"]["ledger"] / MIB for r in rows if r["memory"]), default=0.0)
    for role in ROLES:
        vals = [r["memory"]["by_role"][role] / MIB if r["memory"] else 0 for r in rows]
        # a role too thin to see in every bar (gradients at the peak: in buckets, or 1 KiB) gets no legend entry
        if max(vals) > THIN * tallest:
            ax.bar(range(len(rows)), vals, 0.6, bottom=bottoms, label=f"ledger: {role}", color=ROLE_COLORS[role])
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    unseen = [(i, m["allocator"] / MIB, (m["allocator"] - m["ledger"]) / MIB)
              for i, m in enumerate(r["memory"] for r in rows) if m and m["allocator"] > (1 + UNSEEN) * m["ledger"]]
    peak_label = "allocator's peak" + (" (+N: MiB the ledger did not see)" if unseen else "")
    for key, marker, label in (("allocator", "_", peak_label), ("estimate", "x", "estimate")):
        pts = [(i, (r["memory"][key]["total"] if key == "estimate" else r["memory"][key]) / MIB)
               for i, r in enumerate(rows) if r["memory"] and r["memory"].get(key)]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, s=500 if marker == "_" else 60, color="black", label=label, zorder=3)
    for i, peak, extra in unseen:
        ax.annotate(f"+{extra:.1f}", (i, peak), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7)
    ax.set_ylabel("peak MiB per rank")
    ax.set_title("memory at the peak", fontsize=9)


def _time_panel(ax, rows: list[dict]) -> None:
    x = range(len(rows))
    w = 0.38
    med = lambda key: [r["time"][key]["median"] * 1e3 for r in rows]  # noqa: E731
    iqr = lambda key: [[(r["time"][key]["median"] - r["time"][key]["p25"]) * 1e3 for r in rows],  # noqa: E731
                       [(r["time"][key]["p75"] - r["time"][key]["median"]) * 1e3 for r in rows]]
    ax.bar([i - w / 2 for i in x], med("step"), w, yerr=iqr("step"), capsize=3, label="step", color="#d62728")
    ax.bar([i + w / 2 for i in x], med("baseline"), w, yerr=iqr("baseline"), capsize=3,
           label="plain step (no communication)", color="#2ca02c")
    ax.scatter(x, [r["time"]["alone"] * 1e3 for r in rows], marker="o", facecolors="none", edgecolors="black",
               label="collectives alone", zorder=3)
    ax.scatter(x, [r["time"]["predicted"] * 1e3 for r in rows], marker="x", color="black", label="alpha-beta", zorder=3)
    ax.set_ylabel("ms per step (median, interquartile range)")
    ax.set_title("time", fontsize=9)


def draw_comparison(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 5.6))
    for ax, panel in zip(axes, (_bytes_panel, _memory_panel, _time_panel)):
        panel(ax, rows)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([r["strategy"] for r in rows], rotation=20, fontsize=8)
        if ax.get_legend_handles_labels()[0]:  # memory=false draws no memory panel content
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    fig.suptitle("\n".join(textwrap.wrap(title, 200)), fontsize=9)  # the header: one line at 2+ ranks
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_projection(rows: list[dict], clusters: list[Cluster], path: Path, devices_GB: list[float]) -> Path:
    """The projection (minidist.compare.projection.project's rows): a panel per (model, cluster), comm per step
    vs ranks per strategy (NCCL's choice), compute windows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys((r["model"], r["cluster"]) for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    by_name = {c.name: c for c in clusters}
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 4.0 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (model, cname) in zip(axes.flat, panels):
        mine = [r for r in rows if (r["model"], r["cluster"]) == (model, cname)]
        drawn: dict[tuple, str] = {}
        for k, strategy in enumerate(strategies):
            rs = [r for r in mine if r["strategy"] == strategy]
            series = tuple((r["ranks"], round(r["comm_s"], 12)) for r in rs)
            twin = drawn.setdefault(series, strategy)  # the same calls (zero1, zero2): dashed over the first
            ax.plot([r["ranks"] for r in rs], [r["comm_s"] * 1e3 for r in rs], "-o" if twin == strategy else "--o",
                    ms=3, color=colors[k % 10], label=strategy if twin == strategy else f"{strategy} (= {twin})",
                    mfc=None if twin == strategy else "none")
            bad = [r for r in rs if r["memory_GB"] is not None and not r[f"fits_{devices_GB[0]:g}GB"]]
            if bad:
                ax.plot([r["ranks"] for r in bad], [r["comm_s"] * 1e3 for r in bad], "x", ms=8, color=colors[k % 10])
        ax.axhline(mine[0]["backward_s"] * 1e3, color="black", lw=0.8, ls="--", label="backward compute")
        ax.axhline((mine[0]["forward_s"] + mine[0]["backward_s"]) * 1e3, color="black", lw=0.8, ls=":",
                   label="forward + backward")
        c = by_name[cname]
        if c.gpus_per_node > 1:  # between G and 2G ranks on the log axis
            ax.axvline(c.gpus_per_node * 2 ** 0.5, color="gray", lw=1.0, ls="-.",
                       label=f"leaves the node (> {c.gpus_per_node} ranks)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{model} on {cname}" + (f"\n{c.label}" if c.label else ""), fontsize=8)
        ax.set_xlabel("ranks", fontsize=8)
        ax.set_ylabel("communication ms / step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=6, loc="best", title_fontsize=6,
                  title=f"x: > {devices_GB[0]:g} GB per rank" if any(r["memory_GB"] for r in mine) else None)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

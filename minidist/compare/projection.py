"""Communication time per step at 8 to 1024 ranks, ring against tree, per strategy, from alpha and beta.

    curves = project(layouts, profiles, strategies, ranks, ranks_per_node, intra="nvlink")

For each strategy the collectives of one step come from minidist.compare.analytic.plan (the
same call list the table checks against the trace), each priced by the alpha-beta model of
minidist.comm.cost (CostModel.predict: ring, or tree / recursive halving-doubling) and summed,
as if nothing overlapped: the communication the step must fit somewhere.

Two tiers of links: a collective whose group fits inside one node (the consecutive ranks it
spans <= ranks per node) runs at the intra-node profile (NVLink-class by default), any larger one at the profile
of the curve, since a ring or tree is as slow as its slowest link. That is what hybrid_shard
buys: its all_gathers and reduce_scatters stay inside a node, only the all_reduce of 1/G of
the gradients crosses nodes.

Overlap condition: with data parallelism weak-scaled (a constant batch per rank), compute
per step stays constant as ranks grow; communication can hide behind it at best when
comm <= compute (it needs an exposed head and tail on top, so that is necessary, not
sufficient). Compute per step is the measured one for the measured model, and
6 * params * tokens / (achieved FLOP/s) for a model given by its parameter count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from minidist.comm import CostModel
from minidist.compare.analytic import Layout, plan

ALGORITHMS = ("ring", "tree")


@dataclass(frozen=True)
class Profile:
    name: str
    alpha_s: float
    """Latency per message, seconds."""
    bandwidth_Bps: float
    """Bytes per second one rank sends over one link (beta = 1 / bandwidth)."""

    @property
    def cost(self) -> CostModel:
        return CostModel(self.alpha_s, 1.0 / self.bandwidth_Bps if self.bandwidth_Bps else 0.0)


@dataclass(frozen=True)
class Subject:
    """A model to project: its communication layout and its compute time per step."""

    name: str
    layout: Layout
    compute_s: float


def comm_time(strategy: str, lay: Layout, world: int, algorithm: str, inter: Profile, intra: Profile,
              ranks_per_node: int) -> float:
    """Predicted seconds of communication in one step (every collective, back to back)."""
    shard = min(ranks_per_node, world) if strategy == "hybrid_shard" else None
    total = 0.0
    for call in plan(strategy, lay, world, shard):
        link = intra if call.ranks_spanned <= ranks_per_node else inter
        total += link.cost.predict(call.op, call.payload, call.group_size, algorithm)
    return total


def project(subjects: list[Subject], profiles: list[Profile], strategies: list[str], ranks: list[int],
            ranks_per_node: int, intra: Profile) -> list[dict]:
    """One row per (subject, profile, algorithm, strategy, ranks): predicted comm, compute, hideable."""
    rows = []
    for subj in subjects:
        for prof in profiles:
            inner = prof if prof.name == "calibrated" else intra
            for algo in ALGORITHMS:
                for strategy in strategies:
                    for n in ranks:
                        t = comm_time(strategy, subj.layout, n, algo, prof, inner, ranks_per_node)
                        rows.append({"model": subj.name, "profile": prof.name, "algorithm": algo, "strategy": strategy,
                                     "ranks": n, "comm_s": t, "compute_s": subj.compute_s,
                                     "hideable": t <= subj.compute_s})
    return rows


def verdicts(rows: list[dict]) -> list[str]:
    """One line per (model, profile, strategy): the largest rank count at which compute can hide comm (ring)."""
    lines = []
    keys = dict.fromkeys((r["model"], r["profile"], r["strategy"]) for r in rows if r["algorithm"] == "ring")
    for model, prof, strategy in keys:
        mine = [r for r in rows if (r["model"], r["profile"], r["strategy"], r["algorithm"]) == (model, prof, strategy, "ring")]
        ok = [r["ranks"] for r in mine if r["hideable"]]
        last = mine[-1]
        state = (f"hideable up to {max(ok)} ranks" if ok and max(ok) == last["ranks"] else
                 f"hideable up to {max(ok)} ranks, not beyond" if ok else "never hideable")
        lines.append(f"{model:>10} {prof:>11} {strategy:>13}: comm {last['comm_s'] * 1e3:9.3f} ms at {last['ranks']} "
                     f"ranks vs compute {last['compute_s'] * 1e3:9.3f} ms: {state}")
    return lines


def draw_png(rows: list[dict], path: Path) -> Path:
    """A panel per (model, profile): comm time vs ranks, a line per strategy, ring solid, tree dashed."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    profiles = list(dict.fromkeys(r["profile"] for r in rows))
    strategies = list(dict.fromkeys(r["strategy"] for r in rows))
    fig, axes = plt.subplots(len(models), len(profiles), figsize=(3.6 * len(profiles), 3.2 * len(models)),
                             squeeze=False, sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, model in enumerate(models):
        for j, prof in enumerate(profiles):
            ax = axes[i, j]
            mine = [r for r in rows if r["model"] == model and r["profile"] == prof]
            for k, strategy in enumerate(strategies):
                for algo, style in (("ring", "-"), ("tree", "--")):
                    pts = [(r["ranks"], r["comm_s"] * 1e3) for r in mine if r["strategy"] == strategy and r["algorithm"] == algo]
                    ax.plot(*zip(*pts), style, color=colors[k % len(colors)],
                            label=strategy if algo == "ring" else None, linewidth=1.2)
            ax.axhline(mine[0]["compute_s"] * 1e3, color="black", linewidth=0.8, linestyle=":", label="compute")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{model} / {prof}", fontsize=8)
            ax.tick_params(labelsize=7)
            if j == 0:
                ax.set_ylabel("comm ms / step", fontsize=8)
            if i == len(models) - 1:
                ax.set_xlabel("ranks (ring solid, tree dashed)", fontsize=8)
    axes[0, 0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

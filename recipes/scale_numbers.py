"""Numbers at scale, by formula: NCCL's choice and time per collective, and activation memory per rank.

    python -m recipes.scale_numbers

Two tables, nothing measured (every number follows from the formulas and the shapes, so CI holds
the published copy to the code: scripts/docs_facts.py):

  * minidist.comm.nccl.table(): for each collective NCCL tunes, at 1 KiB to 1 GiB and 8 to 1024
    ranks of HGX H100 nodes, the algorithm and protocol NCCL's own model (tuning.cc) picks, its
    predicted time, and whether the latency or the bandwidth term dominates;
  * minidist.memory.activations.table(): a 7.5B GPT's activations per rank at 8192 tokens in bf16,
    plain, with tensor, sequence and vocabulary parallelism, with full recompute, beside Korthikanti
    et al.'s per-layer formula;
  * the planner (minidist.compare.plan, `recipes.compare --plan`): the layouts of that GPT that fit
    8 HGX H100 nodes at a global batch of 256 x 4096 tokens, fastest first.
"""

from __future__ import annotations

from minidist.comm import nccl
from minidist.memory import activations


def main() -> None:
    print("== NCCL's algorithms and protocols")
    print(nccl.table())
    print("\n== activation memory per rank")
    print(activations.table())
    print("\n== the planner")
    print(plan_case())


def plan_case() -> str:
    """The docs' planner case: the 7.5B GPT on 8 x 8 H100s, 256 sequences of 4096 tokens per step, bf16."""
    from minidist.compare.plan import GPTModel, Hardware
    from minidist.compare.plan_table import report
    return report(GPTModel.of_params(7.5e9, 32), Hardware("h100", nodes=8), 256, 4096, top=6)


if __name__ == "__main__":
    main()

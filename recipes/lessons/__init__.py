"""Runnable lessons: each measures one thing on the CPU (gloo, any number of ranks; CI runs
N = 2 and N = 4), prints a small table and checks one claim with an assertion (a failed claim
exits non-zero). What bytes, call counts, the order of events and memory decide must hold on
every run; what only a clock decides may be missed in --small runs on a loaded machine.

    torchrun --standalone --nproc_per_node=2 -m recipes.lessons.<name> [--small]
    torchrun --standalone --nproc_per_node=4 -m recipes.lessons --all [--small]   # every lesson, one launch
"""

LESSONS = (
    "bucket_sweep",
    "rs_ag_is_all_reduce",
    "fsdp_vs_ddp_bytes",
    "fsdp_memory",
    "prefetch",
    "no_sync",
    "zero1_vs_ddp",
    "gloo_reduce_scatter",
    "tp_vs_ddp_bytes",
    "sequence_parallel",
    "fsdp_x_tp",
    "pp_bubble",
    "pp_memory",
    "pp_vs_dp_tp_bytes",
    "cp_vs_tp_bytes",
    "cp_memory",
    "zigzag_balance",
)
"""Module names under recipes.lessons, in reading order."""

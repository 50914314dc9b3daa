"""minidist.compare: DDP, ZeRO-1 and FSDP side by side, measured next to the formulas.

    torchrun --standalone --nproc_per_node=2 -m recipes.compare      # the table, the charts, the timeline
    python -m recipes.compare --estimate model.n_layer=12           # predicted memory, nothing runs

Modules, one concept each:
    analytic    what each strategy must send per step, call by call (2S(N-1)/N, (3S-S_root)(N-1)/N, ...)
    recorder    phases, waits and collectives of the measured steps on one rank
    intervals   union / intersection of time intervals (overlap arithmetic)
    analysis    raw measurements -> one row: bytes, algbw/busbw, compute vs exposed comm
    memory      MemoryLedger: live tensor bytes of a step by role, at its peak
    profile     the plain model's step on fake tensors (activations, temporaries over time)
    estimate    per-rank peak predicted per strategy and world (ZeRO's formulas + engine rules)
    projection  alpha-beta communication time at 8..1024 ranks, ring vs tree, per link class
    timeline    Chrome trace JSON and a PNG of the measured steps
    report      the table (text, Markdown, CSV, JSON); plots: the bar chart
    measure     one strategy on one rank; run: the whole comparison
"""

from minidist.compare.analytic import Layout, plan, ring_bytes
from minidist.compare.estimate import MemoryEstimate, estimate_memory, model_state_bytes
from minidist.compare.memory import MemoryLedger
from minidist.compare.profile import StepProfile, profile_step

__all__ = ["Layout", "plan", "ring_bytes", "MemoryEstimate", "estimate_memory", "model_state_bytes", "MemoryLedger",
           "StepProfile", "profile_step"]

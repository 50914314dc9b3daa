"""minidist.compare: DDP, ZeRO-1/2 and FSDP side by side, measured next to the formulas.

    torchrun --standalone --nproc_per_node=2 -m recipes.compare      # the table, the charts, the timeline
    python -m recipes.compare --estimate model.n_layer=12           # predicted memory, nothing runs

Modules, one concept each (collective bytes and times come from minidist.comm.trace, the one recorder):
    analytic    what each strategy must send per step, call by call (its record's plan: 2S(N-1)/N, ...)
    measure     one strategy on one rank with the trainer's own step: trace, kernel bytes, plain baseline
    replay      a step's collectives again, one at a time: time alone, algbw / busbw (nccl-tests)
    intervals   union / intersection of time intervals
    analysis    every rank's raw measurements -> one row: bytes, time, memory
    allocator   peak memory as the allocator saw it (torch's profiler on the CPU, the CUDA allocator)
    memory      MemoryLedger: live tensor bytes of a step by role, at its peak
    profile     the plain model's step on fake tensors (activations, temporaries over time)
    estimate    per-rank peak predicted per strategy and world: the profile plus what the engine says it
                holds at each instant (the record's held: ddp/, zero/ and fsdp/footprint.py)
    projection  communication at 8..1024 ranks as NCCL runs it (ring or tree, nodes and NICs), against compute
    timeline    Chrome trace JSON and a PNG of the measured steps
    report      the tables (text, Markdown, CSV, JSON); plots: the bar chart
    progress    the main process's progress bar: the strategy and phase running, a line per strategy
    run         the whole comparison (a signal stops it between phases, keeping what was measured), and --estimate
"""

from minidist.compare.allocator import AllocatorPeak
from minidist.compare.analytic import plan, ring_bytes
from minidist.compare.estimate import MemoryEstimate, estimate_memory, model_state_bytes
from minidist.compare.memory import MemoryLedger
from minidist.compare.profile import StepProfile, profile_step

__all__ = ["AllocatorPeak", "plan", "ring_bytes", "MemoryEstimate", "estimate_memory", "model_state_bytes",
           "MemoryLedger", "StepProfile", "profile_step"]

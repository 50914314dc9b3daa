"""scripts/gen_figures.py memory: live tensor bytes over one training step of DDP, ZeRO-1 and FSDP, at N = 2.

The same GPT and batch under each engine (fp32 AdamW); after two warm-up steps one step runs under
torch's profiler (profile_memory: an event for every allocation and free of the CPU allocator, with
record_function windows for forward, backward and the optimizer step), on top of what the engine
held when the step began, which torch's MemTracker counts (opened before the model was built: every
storage the engine made and still holds, its buckets and flat buffers included). The profiler follows the thread that started it: a block gloo's worker
thread frees is never seen freed, so an address the allocator hands out again is taken as freed then
(what the curve may still over-count is printed: the step's end against its start).
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

ENGINES = ("DDP", "ZeRO-1", "FSDP full_shard")
STEPS = ("forward", "backward", "optimizer")


def build(engine: str):
    from minidist import DDP, FSDP, ShardedOptimizer
    from minidist.models.gpt import GPT, Block, GPTConfig
    torch.manual_seed(0)
    net = GPT(GPTConfig(vocab_size=256, block_size=64, n_layer=4, n_head=4, n_embd=128))
    if engine == "DDP":
        model = DDP(net)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    if engine == "ZeRO-1":
        return net, ShardedOptimizer(net.parameters(), torch.optim.AdamW, lr=1e-3)
    model = FSDP(net, wrap={Block})
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def step(model, opt, x, y, windows: bool = False) -> None:
    from torch.profiler import record_function
    with record_function("forward") if windows else _nothing():
        loss = model(x, y)[1]
    with record_function("backward") if windows else _nothing():
        loss.backward()
    with record_function("optimizer") if windows else _nothing():
        opt.step()
        opt.zero_grad(set_to_none=False)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def built_and_warmed(engine: str, x, y):
    """(model, optimizer, live bytes after two warm-up steps): torch's MemTracker, opened before the model is
    built, counts everything the engine made that is still alive (parameters, gradients, state, buffers)."""
    import gc

    from torch.distributed._tools.mem_tracker import MemTracker
    mt = MemTracker()
    with warnings.catch_warnings(), mt:
        warnings.simplefilter("ignore", UserWarning)
        model, opt = build(engine)
        for _ in range(2):
            step(model, opt, x, y)
            mt.reset_mod_stats()
        dist.barrier()
        gc.collect()
        held = int(mt.get_tracker_snapshot("current").get(torch.device("cpu"), {}).get("Total", 0))
    return model, opt, held


def timeline(model, opt, x, y) -> tuple[list[float], list[float], dict[str, tuple[float, float]]]:
    """(ms, live bytes above the start) at every allocator event of one step, and each phase's (start, end) ms."""
    from torch.profiler import ProfilerActivity, profile
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(model, opt, x, y, windows=True)
    alloc = torch._C._profiler._EventType.Allocation
    events, phases, stack = [], {}, list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.tag == alloc and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.ptr, e.extra_fields.alloc_size))
        elif e.name in STEPS:
            phases[e.name] = (e.start_time_ns, e.end_time_ns)
    t0 = phases["forward"][0]
    live, total, ms, bytes_ = {}, 0, [0.0], [0.0]
    for t, ptr, n in sorted(events):
        if n > 0:
            total += n - live.get(ptr, 0)  # an address handed out again was freed, unseen (gloo's thread)
            live[ptr] = n
        else:
            total -= live.pop(ptr, 0)
        ms.append((t - t0) / 1e6)
        bytes_.append(total)
    return ms, bytes_, {k: ((a - t0) / 1e6, (b - t0) / 1e6) for k, (a, b) in phases.items()}


def memory(save) -> None:
    import matplotlib.pyplot as plt
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randint(0, 256, (4, 65), generator=g)
    x, y = x[:, :-1], x[:, 1:]
    curves = {}
    for engine in ENGINES:
        model, opt, start = built_and_warmed(engine, x, y)
        ms, live, phases = timeline(model, opt, x, y)
        curves[engine] = (ms, [(start + b) / 2**20 for b in live], phases, start)
    if dist.get_rank() != 0:
        return
    fig, axes = plt.subplots(len(ENGINES), 1, figsize=(8.2, 7.5), sharey=True)
    shade = {"forward": "#DDEEFF", "backward": "#FFE8D6", "optimizer": "#E3F2E1"}
    for ax, (engine, (ms, mib, phases, start)) in zip(axes, curves.items()):
        for name, (a, b) in phases.items():
            ax.axvspan(a, b, color=shade[name], label=name)
        ax.plot(ms, mib, color="0.15", lw=1.2, drawstyle="steps-post")
        ax.axhline(start / 2**20, color="0.5", lw=0.8, ls="--")
        ax.set_ylabel("MiB")
        ax.set_title(f"{engine}: {start / 2**20:.1f} MiB held at the step's start (dashed), peak {max(mib):.1f} MiB, "
                     f"{mib[-1] - mib[0]:+.2f} MiB at its end", fontsize=8.5, loc="left")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("ms since the step began (rank 0)")
    fig.suptitle("Live tensor memory over one training step, rank 0 of N = 2:\nGPT of 4 blocks, h = 128, "
                 "4 x 64 tokens per rank, fp32 AdamW", fontsize=9.5)
    fig.tight_layout(rect=(0, 0.03, 1, 0.97))
    save(fig, "memory", "torch.profiler allocation events over the step + MemTracker's count at its start")

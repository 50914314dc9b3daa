"""Activation memory of minidist's GPT: torch's profiler beside the formulas, at N = 1, 2 and 4.

    torchrun --standalone --nproc_per_node=N -m recipes.activation_memory     # N = 1, 2, 4

For each layout the run's world allows (N = 1: plain and full recompute; N > 1: tensor parallelism
over all N ranks, with sequence parallelism, with full recompute as well), one bf16 training forward
of a small GPT: the bytes it allocated and left alive when it returned, from torch's profiler's
allocation events (minidist.compare.allocator: the least of five forwards, since a tensor freed on
gloo's thread is never seen freed), beside minidist.memory.activations' total, its per-layer term
and Korthikanti et al.'s per-layer s b h (34 + 5 a s / h) and its TP, SP and recompute forms
(2-byte activations: what bf16 keeps). Rank 0 prints; every rank measures its own (the same
shapes, so the same bytes).
"""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist

from minidist.memory import GPTShape, Parallelism, activation_bytes, korthikanti
from minidist.models.gpt import GPT, GPTConfig

CFG = dict(vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=64)
BATCH = 4
REPEATS = 5


def layouts(n: int) -> list[tuple[str, Parallelism]]:
    if n == 1:
        return [("plain", Parallelism()), ("full recompute", Parallelism(recompute="full"))]
    return [(f"tp {n}", Parallelism(tp=n)), (f"tp {n} + sp", Parallelism(tp=n, sequence_parallel=True)),
            (f"tp {n} + sp + recompute", Parallelism(tp=n, sequence_parallel=True, recompute="full"))]


def model_for(par: Parallelism) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig(**CFG, activation_checkpointing=par.recompute == "full"))
    if par.tp > 1:
        from torch.distributed.device_mesh import init_device_mesh

        from minidist.mesh import TP
        from minidist.tp import parallelize_gpt
        mesh = init_device_mesh("cpu", (par.tp,), mesh_dim_names=(TP,))
        model = parallelize_gpt(model, mesh, sequence_parallel=par.sequence_parallel)
    return model.to(torch.bfloat16).train()   # as an engine's bf16 compute copies


def measured(model: GPT) -> int:
    """Bytes one forward allocated and left alive (the profiler's events), the least of REPEATS."""
    from minidist.compare.allocator import AllocatorPeak
    g = torch.Generator().manual_seed(1)
    idx, tgt = (torch.randint(0, CFG["vocab_size"], (BATCH, CFG["block_size"]), generator=g) for _ in range(2))
    best = None
    for _ in range(REPEATS):
        gc.collect()
        with AllocatorPeak(torch.device("cpu")) as peak:
            with peak.window():
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    result = model(idx, tgt)
        del result
        best = min(best or 1 << 62, alive(peak.events))
    return best


def alive(events) -> int:
    """Bytes allocated and not freed by the end, from the profiler's (time, address, signed bytes) events."""
    live: dict[int, int] = {}
    for _, ptr, nbytes in events:
        if nbytes > 0:
            live[ptr] = nbytes
        else:
            live.pop(ptr, None)
    return sum(live.values())


def formula_row(name: str, par: Parallelism) -> tuple[str, float, float, float]:
    """(layout, minidist's total, minidist's per layer, the paper's per layer), bytes per rank."""
    shape = GPTShape.of(GPTConfig(**CFG), batch=BATCH)
    acts = activation_bytes(shape, "bf16", par)
    return name, acts.total, acts.per_layer, korthikanti(shape, par)


HEADER = f"{'layout':<28}{'measured':>10}{'formula':>10}{'ratio':>7}{'layer':>9}{'paper':>9}"


def table_head() -> str:
    c = CFG
    return (f"GPT L = {c['n_layer']}, h = {c['n_embd']}, a = {c['n_head']}, V = {c['vocab_size']}; b = {BATCH} x s = "
            f"{c['block_size']} tokens; bf16; KiB per rank\n{HEADER}")


def row(name: str, par: Parallelism, got: int | None) -> str:
    _, total, layer, paper = formula_row(name, par)
    got_s, ratio = (f"{got / 1024:>10.1f}", f"{got / total:>7.3f}") if got is not None else (f"{'-':>10}", f"{'-':>7}")
    return f"{name:<28}{got_s}{total / 1024:>10.1f}{ratio}{layer / 1024:>9.1f}{paper / 1024:>9.1f}"


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    try:
        n = dist.get_world_size()
        rows = [row(name, par, measured(model_for(par))) for name, par in layouts(n)]
        if dist.get_rank() == 0:
            print(f"== N = {n}\n{table_head()}\n" + "\n".join(rows), flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

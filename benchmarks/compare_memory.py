"""minidist.compare.estimate against torch's allocator: 3 GPT sizes x 7 strategies x world 1, 2, 4.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compare_memory.py          # spawns the worlds itself

For every world size, that many gloo processes (a FileStore, no torchrun) build each model under
each strategy exactly as `recipes.compare` does (minidist.compare.measure.measure_memory: the
trainer's parallelize/build_optimizer and step, two warm-up steps, two measured steps) under
torch's profiler: the peak of the allocator's events (minidist.compare.allocator), the rank with
the largest. The parent predicts the same with estimate_memory on a fake-tensor profile of the
model (nothing runs) and prints the error (goal: every case within 2%). The unit tests
(tests/compare/test_measure.py) check one size at world 2: the comparison's run within 5%, and
every strategy in both training loops (zero_grad after step, zero_grad before forward) within 2%.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

STRATEGIES = ["ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "hybrid_shard"]
SIZES = {  # overrides of configs/compare.yaml
    "S (35K)": ["model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=16", "trainer.batch_size=4"],
    "M (0.21M)": ["model.n_layer=4", "model.n_embd=64", "model.n_head=4", "model.block_size=32", "trainer.batch_size=4"],
    "L (1.6M)": [],  # the comparison's default model
}
COMMON = ["data=synthetic", "data.train_samples=256", "data.val_samples=8", f"strategies=[{','.join(STRATEGIES)}]"]


def _worker(rank: int, world: int, store: str, queue) -> None:
    import torch
    import torch.distributed as dist

    from minidist import runtime
    from minidist.compare.measure import measure_memory
    from minidist.train.data import build_datasets
    from recipes.compare import compose

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    topo = runtime.init("gloo")
    out = {}
    for size, overrides in SIZES.items():
        cfg = compose(COMMON + overrides)
        train_ds = build_datasets(cfg, topo)[0]
        for name in STRATEGIES:
            out[(size, name)] = measure_memory(cfg, cfg.strategy_options[name], topo, train_ds)["allocator"]
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(out, gathered, dst=0)
    if rank == 0:
        queue.put({k: max(g[k] for g in gathered) for k in out})
    dist.destroy_process_group()


def measured(world: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        procs = [ctx.Process(target=_worker, args=(r, world, os.path.join(d, "store"), queue)) for r in range(world)]
        for p in procs:
            p.start()
        result = queue.get(timeout=900)
        for p in procs:
            p.join()
    return result


def main() -> None:
    from minidist.compare.estimate import estimate_memory
    from minidist.compare.run import _profile
    from recipes.compare import compose

    cfg = compose(COMMON)
    profiles = {size: _profile(compose(COMMON + o))[0] for size, o in SIZES.items()}
    errors = []
    print(f"{'model':<10} {'world':>5} {'strategy':<14} {'measured MiB':>12} {'predicted MiB':>13} {'error':>7}")
    for world in (1, 2, 4):
        t0 = time.perf_counter()
        got = measured(world)
        for (size, name), peak in got.items():
            est = estimate_memory(profiles[size], cfg.strategy_options[name], world).total  # one node: group = world
            errors.append(est / peak - 1)
            print(f"{size:<10} {world:>5} {name:<14} {peak / 2**20:12.3f} {est / 2**20:13.3f} {100 * errors[-1]:+6.1f}%")
        print(f"  (world {world}: {time.perf_counter() - t0:.0f} s)")
    worst = max(errors, key=abs)
    print(f"{len(errors)} cases, worst error {100 * worst:+.1f}%, mean |error| "
          f"{100 * sum(map(abs, errors)) / len(errors):.1f}%: {'within' if abs(worst) <= 0.02 else 'OUTSIDE'} +-2%")


if __name__ == "__main__":
    main()

"""The training loop, the same for every strategy and model.

    topo = minidist.runtime.init(); cfg = compose_config([...])
    result = train(cfg, topo)        # on every rank; returns the final validation metrics

One optimizer step = grad_accum micro-batches per rank. Only the last one
communicates (the others run under strategy.no_sync()), so the step costs one
gradient reduction however many micro-batches it has. Every log_interval-th
step runs inside minidist.comm.trace(), so the metrics show what that step sent.
train() does not create or destroy the process group: the recipe (or a test
harness) owns it.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import random
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from minidist import Topology, comm
from minidist.train.checkpoint import Checkpointer
from minidist.train.data import BatchStream, build_datasets
from minidist.train.metrics import NullLogger, RunLogger, comm_summary, plot
from minidist.train.strategy import build_strategy
from minidist.train.task import make_task

CRASH_MARKER = "crash_injected"


def lr_at(step: int, optim_cfg, total_steps: int) -> float:
    """Linear warmup over warmup_steps, then cosine from lr down to lr * min_lr_ratio at the last step."""
    peak, warm = optim_cfg.lr, optim_cfg.warmup_steps
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total_steps - warm)
    floor = peak * optim_cfg.min_lr_ratio
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def run_dir_for(cfg, topo: Topology) -> Path:
    """<out_dir>/<name>, the same on every rank: a missing name is chosen by rank 0 and broadcast."""
    name = cfg.name
    if not name:
        buf = torch.zeros(256, dtype=torch.uint8, device=topo.device)  # NCCL: device tensors only
        if topo.is_main:
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            raw = f"{cfg.model.name}-{cfg.strategy.name}-{stamp}".encode()
            buf[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8, device=topo.device)
        comm.broadcast(buf, src=0, group=topo.group)
        name = bytes(buf[buf != 0].cpu().tolist()).decode()
    return Path(cfg.out_dir) / name


def _all_mean(values: list[float], topo: Topology) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=topo.device)
    comm.all_reduce(t, group=topo.group)
    return (t / topo.world_size).cpu().tolist()


@torch.no_grad()
def evaluate(strategy, task, stream: BatchStream, device, max_batches, autocast) -> dict[str, float]:
    """Every rank runs the same number of validation batches of its own shard; sums are all-reduced."""
    model = strategy.model
    model.eval()
    sums = None
    for batch in stream.one_pass(max_batches):
        with autocast():
            s = task.eval_sums(model, [b.to(device) for b in batch])
        sums = s if sums is None else sums + s
    model.train()
    comm.all_reduce(sums, group=strategy.topo.group)
    return task.report(sums.cpu())


def _sample(cfg, task, full_state: dict, n_bytes: int) -> str:
    """Rank 0: a fresh copy of the model on the CPU, loaded with the full state, continues a prompt."""
    model, _ = task.build()
    model.load_state_dict(full_state)
    model.eval()
    prompt = torch.tensor([list(b"def ")], dtype=torch.long)
    out = model.generate(prompt, n_bytes, temperature=0.8, top_k=40, generator=torch.Generator().manual_seed(0))
    return bytes(out[0].tolist()).decode("utf-8", errors="replace")


def train(cfg, topo: Topology) -> dict:
    """Run (or resume) the training described by cfg on every rank of topo; return the final metrics."""
    t0 = time.perf_counter()
    tc = cfg.trainer
    run_dir = run_dir_for(cfg, topo)
    if topo.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    torch.manual_seed(tc.seed)
    random.seed(tc.seed)

    task = make_task(cfg.model)
    model, blocks = task.build()  # identical init on every rank (same seed)
    strategy = build_strategy(cfg.strategy, model.to(topo.device), cfg.optim, topo, blocks)
    train_ds, val_ds, info = build_datasets(cfg, topo)
    stream = BatchStream(train_ds, tc.batch_size, topo.rank, topo.world_size, tc.seed)
    val_stream = BatchStream(val_ds, tc.batch_size, topo.rank, topo.world_size, tc.seed, shuffle=False)
    ckpt = Checkpointer(run_dir, tc.keep_last, strategy)

    start = 0
    if cfg.resume != "never":
        d = ckpt.latest() if cfg.resume == "auto" else Path(cfg.resume)
        if d is not None:
            state = ckpt.load(d)
            start = int(state["step"])
            stream.load_state_dict(state["data"])

    bf16 = tc.precision.value == "bf16"
    autocast = lambda: torch.autocast(topo.device.type, dtype=torch.bfloat16, enabled=bf16)  # noqa: E731
    logger = (RunLogger(run_dir, cfg, start, tc.steps, OmegaConf.to_container(cfg, enum_to_str=True), run_dir.name)
              if topo.is_main else NullLogger())
    if start:
        logger.message(f"resumed from step {start} ({d})")
    per_step_items = None
    window_loss, window_time, window_steps = 0.0, 0.0, 0
    result: dict = {"run_dir": str(run_dir), "stopped": False, **info}
    opt = strategy.optimizer

    try:  # the logger's files are closed however the loop ends (a crash included)
        for step in range(start, tc.steps):
            if tc.crash_at_step == step + 1 and topo.is_main and not (run_dir / CRASH_MARKER).exists():
                (run_dir / CRASH_MARKER).write_text("rank 0 crashed here once, on purpose\n")
                raise RuntimeError(f"injected crash before step {step + 1} (trainer.crash_at_step)")
            lr = lr_at(step, cfg.optim, tc.steps)
            for group in opt.param_groups:
                group["lr"] = lr
            traced = (step + 1) % tc.log_interval == 0
            ts = time.perf_counter()
            with comm.trace() if traced else contextlib.nullcontext() as tr:
                step_loss = torch.zeros((), device=topo.device)  # summed on device: no host sync per step
                for micro in range(tc.grad_accum):
                    batch = [b.to(topo.device, non_blocking=True) for b in next(stream)]
                    per_step_items = per_step_items or task.count(batch) * tc.grad_accum * topo.world_size
                    last = micro == tc.grad_accum - 1
                    with (contextlib.nullcontext() if last else strategy.no_sync()), autocast():
                        loss = task.loss(strategy.model, batch) / tc.grad_accum
                    loss.backward()
                    step_loss += loss.detach()
                gnorm = strategy.clip_grad_norm_(tc.grad_clip) if tc.grad_clip > 0 else float("nan")
                opt.step()
                opt.zero_grad(set_to_none=True)
            window_time += time.perf_counter() - ts
            window_loss += step_loss
            window_steps += 1
            done = step + 1

            if traced or done == tc.steps:
                mean_loss, = _all_mean([float(window_loss) / window_steps], topo)
                step_s = window_time / window_steps
                row = {"step": done, "train/loss": mean_loss, "train/lr": lr, "train/grad_norm": gnorm,
                       "train/step_s": step_s, f"train/{task.unit}_per_s": per_step_items / step_s}
                if traced:
                    row |= comm_summary(tr)
                logger.log(row)
                logger.progress(done, {"loss": f"{mean_loss:.3f}", f"{task.unit[:3]}/s": f"{per_step_items / step_s:,.0f}",
                                       "step": f"{step_s * 1e3:.0f}ms"})
                window_loss, window_time, window_steps = 0.0, 0.0, 0
            if tc.eval_interval and done % tc.eval_interval == 0 and done != tc.steps:
                metrics = evaluate(strategy, task, val_stream, topo.device, tc.eval_batches, autocast)
                logger.log({"step": done, **metrics})
                logger.message(f"step {done}: " + "  ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            stopping = tc.stop_after is not None and done == tc.stop_after and done != tc.steps
            if (tc.ckpt_interval and done % tc.ckpt_interval == 0) or stopping:
                ckpt.save(done, {"step": done, "data": stream.state_dict(), "lr": lr})
            if stopping:
                logger.message(f"stopping after step {done} (trainer.stop_after); resume=auto continues")
                return result | {"stopped": True, "step": done}

        final = evaluate(strategy, task, val_stream, topo.device, None, autocast)
        full_state = strategy.full_state_dict()
        result |= final | {"step": tc.steps, "wall_s": time.perf_counter() - t0}
        if topo.is_main:
            lines = [f"final  " + "  ".join(f"{k} {v:.4f}" for k, v in final.items())]
            if "unigram_bpb" in info:
                ratio = final["val/bits_per_byte"] / info["unigram_bpb"]
                result["bpb_vs_unigram"] = ratio
                lines.append(f"unigram baseline {info['unigram_bpb']:.4f} bits/byte; model reaches {ratio:.1%} of it")
            if tc.sample_bytes and task.unit == "tokens":
                lines.append("sample:\n" + _sample(cfg, task, full_state, tc.sample_bytes))
            logger.log({"step": tc.steps, **{f"final/{k.split('/')[-1]}": v for k, v in final.items()}})
            png = plot(run_dir, task.unit)
            lines.append(f"outputs in {run_dir} (metrics.jsonl, {png.name}, config.yaml)")
            result["model_state"] = full_state
            for line in lines:
                logger.message(line)
        return result
    finally:
        logger.close()

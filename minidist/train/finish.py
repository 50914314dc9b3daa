"""How a run ends: the final evaluation, the model file, a text sample and the plot; or a stop, with its checkpoint.

    metrics = evaluate(run, max_batches)   # the validation shard of every rank, summed over the data-parallel ranks
    result = finish(run)                   # after the last step
    result = stopped(run, done)            # after a requested stop or a preemption (the checkpoint is saved)

The loop that calls them is minidist.train.trainer; `run` is its Run.
"""

from __future__ import annotations

import time
import torch

from minidist.models.saved import save_model
from minidist.mesh import PP
from minidist.parallel.parallelize import full_state_dict
from minidist.train import pipeline_step
from minidist.train.metrics import plot
from minidist.train.run_state import Run

PREEMPTED = "PREEMPTED"
"""Marker in the run directory: the last stop was a preemption (launch/slurm.sbatch requeues on it)."""


@torch.no_grad()
def evaluate(run: Run, max_batches: int | None) -> dict[str, float]:
    """Every rank runs the same number of validation batches of its own shard; the sums are all-reduced over
    the data-parallel ranks (cp ranks' losses are their shard's mean over all its tokens already)."""
    run.model.eval()
    sums = None
    for batch in run.val_stream.one_pass(max_batches):
        with run.autocast():
            s = pipeline_step.eval_sums(run, batch) if run.layout.size(PP) > 1 else \
                run.task.eval_sums(run.model, run.local_batch([b.to(run.topo.device) for b in batch]))
        sums = s if sums is None else sums + s
    run.model.train()
    return run.task.report(run.layout.all_reduce(sums).cpu())


def finish(run: Run) -> dict:
    """Final evaluation on the whole validation split, the model file, a text sample and the plot."""
    tc = run.cfg.trainer
    final = evaluate(run, None)
    full_state = full_state_dict(run.model, run.layout, run.strategy)
    result = {"run_dir": str(run.run_dir), "stopped": False, **run.info, **final, "step": tc.steps,
              "wall_s": time.perf_counter() - run.t0}
    if not run.layout.is_main:
        return result
    lines = ["final  " + "  ".join(f"{k} {v:.4f}" for k, v in final.items())]
    if "unigram_bpb" in run.info:
        ratio = final["val/bits_per_byte"] / run.info["unigram_bpb"]
        result["bpb_vs_unigram"] = ratio
        lines.append(f"bits per byte: {final['val/bits_per_byte']:.2f}, unigram baseline "
                     f"{run.info['unigram_bpb']:.2f}, ratio {ratio:.2f} (lower is better)")
    if tc.sample_bytes and run.task.unit == "tokens":
        lines.append("sample:\n" + _sample(run.task, full_state, tc.sample_bytes))
    model_file = save_model(run.run_dir, run.cfg.model, full_state, tc.steps)
    run.logger.log({"step": tc.steps, **{f"final/{k.split('/')[-1]}": v for k, v in final.items()}})
    png = plot(run.run_dir, run.task.unit)
    where = run.run_dir.resolve()
    lines.append(f"outputs in {where} ({model_file.name}, metrics.jsonl, {png.name}, .hydra/config.yaml); "
                 f"the model: minidist.models.load({str(where)!r})")
    for line in lines:
        run.logger.message(line)
    return result | {"model_state": full_state}


def _sample(task, full_state: dict, n_bytes: int) -> str:
    """A fresh copy of the model on the CPU, loaded with the full state, continues a prompt."""
    model, _ = task.build()
    model.load_state_dict(full_state)
    model.eval()
    prompt = torch.tensor([list(b"def ")], dtype=torch.long)
    out = model.generate(prompt, n_bytes, temperature=0.8, top_k=40, generator=torch.Generator().manual_seed(0))
    return bytes(out[0].tolist()).decode("utf-8", errors="replace")


def stopped(run: Run, done: int) -> dict:
    caught = run.preemption.caught
    why = "stopped" if not run.preempted else f"interrupted ({caught})" if caught == "SIGINT" else \
        f"preempted ({caught or 'a signal on another rank'})"
    if run.layout.is_main and run.preempted:
        (run.run_dir / PREEMPTED).write_text(f"{done}\n")
    command = run.request.command if run.request is not None else None
    run.logger.message(f"{why} after step {done}, checkpoint saved in {run.ckpt.step_dir(done)}; "
                       + (f"continue with:\n  {command}" if command else "resume=auto continues"))
    return {"run_dir": str(run.run_dir), "stopped": True, "preempted": run.preempted, "step": done}

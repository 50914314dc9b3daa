"""The recipe with tensor parallelism, as users launch it, in one torchrun at 2 processes that also checks
Hydra's --multirun under torchrun: a sweep of two jobs of experiment=gpt_tiny at tp 2, ddp then full_shard.
Every rank runs the same jobs and only the main process writes; both jobs end at the validation loss of one
process on the same global batch and seed (within 1e-3 relative), and full_shard's model.pt loads into the
plain GPT whole (minidist.models.load), equal to one process's final weights.

What the command line adds is checked here; the 2-D mesh (dp 2 x tp 2, world 4) is checked in the pool by
tests/train/test_checkpoint_tp.py (full_shard over dp 2 x tp 2 equals its resumed runs, its model.pt loads
whole) and tests/parallel/test_parallelize_tp.py, without 5 more interpreters starting here."""

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import minidist
from minidist import runtime
from minidist.cli import compose_config
from minidist.train import train
from minidist.train.metrics import read_metrics
from tests.harness import run_command

REPO = Path(__file__).resolve().parents[2]
RUN = ["experiment=gpt_tiny", "trainer.steps=8", "trainer.log_interval=4", "trainer.eval_interval=0",
       "trainer.ckpt_interval=0", "data.max_bytes=200000", "trainer.sample_bytes=16"]
STRATEGIES = ["ddp", "full_shard"]


def _one_process(out: str) -> dict:
    """The same global batch in one process (tp 2 at world 2 leaves dp = 1: the batch is one rank's)."""
    result = train(compose_config(RUN + ["strategy=single", f"out_dir={out}", "name=single"]), runtime.init("gloo"))
    return {"val": result["val/loss"], "state": result["model_state"]}


@pytest.mark.launches
def test_a_sweep_at_tp2_under_torchrun_ends_where_one_process_ends(run_dist, tmp_path):
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
           "recipes.train", "--multirun", f"strategy={','.join(STRATEGIES)}", "strategy.tp_size=2", *RUN,
           f"hydra.sweep.dir={sweep_dir}"]
    p = run_command(cmd, timeout=300, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Warning" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    # the sweep: printed by the main process only, every job recorded
    assert p.stdout.count("Launching 2 jobs") == 1 and p.stdout.count("final ") == 2, p.stdout
    summary = [json.loads(line) for line in (sweep_dir / "summary.jsonl").read_text().splitlines()]
    assert [(r["job"], r["overrides"], r["status"]) for r in summary] == \
        [(0, "strategy=ddp", "done"), (1, "strategy=full_shard", "done")]
    assert f"sweep {sweep_dir}: 2 of 2 jobs ran, 2 succeeded" in p.stdout
    assert (sweep_dir / "multirun.yaml").is_file()
    for job, strategy in enumerate(STRATEGIES):
        run = sweep_dir / str(job)
        config = OmegaConf.load(run / ".hydra" / "config.yaml")
        assert config.strategy.name == strategy and config.strategy.tp_size == 2
        assert f"strategy={strategy}" in OmegaConf.load(run / ".hydra" / "overrides.yaml")
        assert OmegaConf.load(run / ".hydra" / "hydra.yaml").hydra.job.num == job
        assert (run / "model.pt").is_file() and read_metrics(run / "metrics.jsonl")[-1]["step"] == 8
    # both jobs end where one process without TP ends
    one = run_dist(1, _one_process, str(tmp_path), timeout=240)[0]
    for r in summary:
        assert abs(r["val/loss"] - one["val"]) <= 1e-3 * one["val"], (r, one["val"])
    final = read_metrics(sweep_dir / "1" / "metrics.jsonl")[-1]
    assert abs(final["final/loss"] - one["val"]) <= 1e-3 * one["val"], (final["final/loss"], one["val"])
    model = minidist.models.load(sweep_dir / "1")  # no process group: the whole GPT
    assert isinstance(model, minidist.models.GPT) and model.blocks[0].attn.qkv.weight.shape == (96, 32)
    worst = max((v - one["state"][k]).abs().max().item() for k, v in model.state_dict().items())
    assert worst < 1e-3, worst  # q|k|v assembled block by block: a mix-up would differ by the weights themselves
    assert p.stdout.count("sample:") == 2  # the trainer's own sample, from the whole model
    with torch.no_grad():
        assert model.generate(torch.tensor([list(b"def ")]), 4).shape == (1, 8)

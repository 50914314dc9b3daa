"""The recipe with tensor parallelism, as users launch it: twenty steps of experiment=gpt_tiny under
torchrun at 4 processes, full_shard over dp 2 x tp 2, end at the validation loss of 2-process DDP with
the same global batch and seed (within 1e-3 relative), and leave a model.pt that loads into the plain
GPT whole (minidist.models.load), equal to DDP's final weights."""

import os
import subprocess
import sys
from pathlib import Path

import torch

import minidist
from minidist import runtime
from minidist.cli import compose_config
from minidist.train import train
from minidist.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
RUN = ["experiment=gpt_tiny", "trainer.steps=20", "trainer.eval_interval=0", "trainer.ckpt_interval=0",
       "data.max_bytes=200000", "trainer.sample_bytes=16"]


def _ddp_reference(out: str) -> dict:
    topo = runtime.init("gloo")
    result = train(compose_config(RUN + ["strategy=ddp", f"out_dir={out}", "name=ddp"]), topo)
    return {"val": result.get("val/loss"), "state": result.get("model_state")}


def test_full_shard_over_dp2_x_tp2_ends_where_ddp_ends(run_dist, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m",
           "recipes.train", *RUN, "strategy=full_shard", "strategy.tp_size=2", f"out_dir={tmp_path}", "name=tp"]
    p = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "Warning" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    ddp = run_dist(2, _ddp_reference, str(tmp_path), timeout=240)[0]
    final = read_metrics(tmp_path / "tp" / "metrics.jsonl")[-1]
    assert abs(final["final/loss"] - ddp["val"]) <= 1e-3 * ddp["val"], (final["final/loss"], ddp["val"])
    config = (tmp_path / "tp" / ".hydra" / "config.yaml").read_text()
    assert "tp_size: 2" in config and "name: full_shard" in config
    model = minidist.models.load(tmp_path / "tp")  # no process group: the whole GPT
    assert isinstance(model, minidist.models.GPT) and model.blocks[0].attn.qkv.weight.shape == (96, 32)
    worst = max((v - ddp["state"][k]).abs().max().item() for k, v in model.state_dict().items())
    assert worst < 1e-3, worst  # q|k|v assembled block by block: a mix-up would differ by the weights themselves
    assert "sample:" in p.stdout  # the trainer's own sample, from the whole model
    with torch.no_grad():
        assert model.generate(torch.tensor([list(b"def ")]), 4).shape == (1, 8)

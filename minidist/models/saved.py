"""The model a run leaves behind: <run>/model.pt, loadable into the plain model class in one call.

    model = minidist.models.load("outputs/my-run")     # GPT or resnet18, eval mode, on the CPU
    out = model.generate(torch.tensor([list(b"def ")]), 200, temperature=0.8, top_k=40)

The trainer's finish writes it from the main process: the whole model's state dict
(gathered from the shards under FSDP, unwrapped from DDP), the model's config group
and the step. It holds tensors and plain values only, so it loads with
weights_only=True and needs no minidist wrapper, mesh or process group. Checkpoints
(<run>/checkpoints/, for resuming) are a different thing: optimizer, RNG and data
position too, sharded by strategy.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
import torch.nn as nn
from omegaconf import OmegaConf

MODEL_FILE = "model.pt"


def save_model(run_dir: Path, model_cfg, state_dict: dict, step: int) -> Path:
    """Write <run_dir>/model.pt atomically (a crash mid-write leaves no half file under that name)."""
    config = OmegaConf.to_container(model_cfg, enum_to_str=True) if OmegaConf.is_config(model_cfg) \
        else dict(model_cfg)
    path = Path(run_dir) / MODEL_FILE
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    torch.save({"model": state_dict, "config": config, "step": step}, tmp)
    os.replace(tmp, path)
    return path


def build(config: dict) -> nn.Module:
    """The plain model a model config group describes (name: gpt or resnet18)."""
    fields = {k: v for k, v in config.items() if k != "name"}
    if config["name"] == "gpt":
        from minidist.models.gpt import GPT, GPTConfig
        known = {f.name for f in dataclasses.fields(GPTConfig)}
        return GPT(GPTConfig(**{k: v for k, v in fields.items() if k in known}))
    if config["name"] == "resnet18":
        from minidist.models.resnet import resnet18_cifar
        return resnet18_cifar(fields.get("num_classes", 10))
    raise ValueError(f"unknown model name {config['name']!r} in a saved model; known: gpt, resnet18")


def load(path: str | Path, map_location: str | torch.device = "cpu") -> nn.Module:
    """The model a run finished with: `path` is the run directory or its model.pt. Eval mode."""
    path = Path(path)
    file = path / MODEL_FILE if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist: a run writes it when it finishes")
    saved = torch.load(file, map_location=map_location, weights_only=True)
    model = build(saved["config"])
    model.load_state_dict(saved["model"])
    return model.eval()

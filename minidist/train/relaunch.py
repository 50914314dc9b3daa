"""A relaunch of an existing run: which settings differ from its saved config, and what happens to each.

    notes = changes(saved, wanted, run_dir)   # one line per differing key; ValueError for a model that cannot load

`saved` and `wanted` are run_dir.fingerprint()s: the run's <run>/.hydra/config.yaml and this
command's config, without what never changes what a run computes (name, out_dir, resume,
timeout_s, logger, trainer.steps, trainer.progress_bar). Decided by the main process before
anything is written (run_dir.decide); a refusal is one line, exit 64, the run's files untouched.

- model: the parameters' shapes decide. A change that keeps them (dropout, activation
  checkpointing) loads the saved weights and applies from the resumed step; one that changes
  them (n_layer, n_embd, ...) cannot load, and the relaunch is refused, naming the keys and
  the two ways on: the run's own values, or another name= for a new run. A run without a
  checkpoint is refused too: restarting it would put a run of another model under its name.
- strategy: the run continues under the new one (checkpoints resume across strategies where
  their files allow: minidist.train.checkpoint, which refuses otherwise in one line).
- data: the run continues on the new data from the saved position.
- anything else (optim, trainer, seed, backend): the new value applies from the resumed step.
"""

from __future__ import annotations

from pathlib import Path

import torch
from omegaconf import OmegaConf

from minidist.train.task import make_task


def flat(tree: dict, prefix: str = "") -> dict[str, object]:
    """{"model.n_layer": 2, ...}: every leaf of a nested config under its dotted key."""
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


ABSENT = object()
"""A key one config has and the other not (a field added or removed between versions)."""


PRESET = {"strategy": "name", "model": "name", "data": "source", "optim": "name"}
"""The key that names a group's preset: when it changed, the other preset's own fields are its business."""


def differing(saved: dict, wanted: dict) -> list[tuple[str, object, object]]:
    """(key, saved value, wanted value) for every leaf that differs, in key order; where a group's preset
    changed (strategy=ddp -> full_shard), the fields only one of the two presets has are left out."""
    a, b = flat(saved), flat(wanted)
    swapped = {g for g, k in PRESET.items() if a.get(f"{g}.{k}", ABSENT) != b.get(f"{g}.{k}", ABSENT)}
    return [(k, a.get(k, ABSENT), b.get(k, ABSENT)) for k in sorted(a.keys() | b.keys())
            if a.get(k, ABSENT) != b.get(k, ABSENT)
            and not (k.split(".")[0] in swapped and ABSENT in (a.get(k, ABSENT), b.get(k, ABSENT)))]


def parameter_shapes(model_cfg: dict) -> dict[str, tuple[int, ...]] | None:
    """The model's state_dict shapes, built on the meta device (no memory); None if it cannot be built."""
    try:
        with torch.device("meta"):
            model, _ = make_task(OmegaConf.create(model_cfg)).build()
    except Exception:  # noqa: BLE001 - a saved config this version cannot build: it cannot load either
        return None
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _show(value) -> str:
    return "(absent)" if value is ABSENT else "null" if value is None else str(value)


def changes(saved: dict, wanted: dict, run_dir: Path, has_checkpoint: bool) -> list[str]:
    """One line per differing key saying what happens to it; ValueError (one line) for a model that cannot
    load, or a model change in a run with no checkpoint (module docstring)."""
    if "model" not in saved:  # not a run's config (or none): nothing to hold this command against
        return []
    diffs = differing(saved, wanted)
    model = [d for d in diffs if d[0].startswith("model.")]
    loads = not model or parameter_shapes(saved.get("model", {})) == parameter_shapes(wanted.get("model", {}))
    if model and (not loads or not has_checkpoint):
        keys = ", ".join(f"{k}={_show(new)} (the run's: {_show(old)})" for k, old, new in model)
        why = "its weights cannot load into this model" if not loads else \
            "it has no checkpoint, and starting it over would put a run of another model under its name"
        raise ValueError(f"{run_dir.resolve()} holds a run of another model: {keys}; {why}. Continue it with "
                         f"its own settings ({run_dir / '.hydra' / 'config.yaml'}), or choose another name= for a "
                         f"new run")
    lines = []
    for key, old, new in diffs:
        what = ("continuing with the new value (the saved weights load: same parameter shapes)"
                if key.startswith("model.") else
                "continuing under the new strategy" if key == "strategy.name" else
                "continuing with the new strategy setting" if key.startswith("strategy.") else
                "continuing on the new data from the saved position" if key.startswith("data.") else
                "the new value applies from the resumed step")
        lines.append(f"{key}: {_show(old)} in the run, {_show(new)} now: {what}")
    return lines

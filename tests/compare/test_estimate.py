"""The memory estimator's formulas: ZeRO's Figure 1, and per-strategy structure on a small model."""

from __future__ import annotations

import pytest
import torch

from minidist.compare.estimate import estimate_memory, model_state_bytes
from minidist.compare.profile import profile_step


def test_zero_paper_figure_1():
    """Psi = 7.5B, N = 64, K = 12, fp16 parameters and gradients: 120, 31.4, 16.6, 1.9 GB."""
    gb = {s: model_state_bytes(7.5e9, s, 64, 2, 2, 12)["total"] / 1e9
          for s in ("ddp", "zero1", "shard_grad_op", "full_shard")}
    assert [round(gb[s], 1) for s in ("ddp", "zero1", "shard_grad_op", "full_shard")] == [120.0, 31.4, 16.6, 1.9]


def _profile(n_layer=3, batch=2):
    from minidist.models.gpt import GPT, Block
    from tests.common import tiny_gpt_config
    with torch.device("meta"):
        model = GPT(tiny_gpt_config(n_layer=n_layer))
    x = torch.empty(batch, 16, dtype=torch.long, device="meta")
    return profile_step(model, [x, x], lambda m, b: m(b[0], b[1])[1], {Block})


def test_profile_and_estimate_structure():
    prof = _profile()
    assert len(prof.unit_numels) == 4 and prof.segments[0] == 0 and prof.segments[-1] == 0
    assert any(s.backward for s in prof.samples) and max(s.activations for s in prof.samples) > 0
    ddp1, ddp4 = estimate_memory(prof, "ddp", 1), estimate_memory(prof, "ddp", 4)
    assert ddp1.total == ddp4.total                       # DDP replicates everything
    fs = [estimate_memory(prof, "full_shard", n).by_role["parameters"] for n in (1, 2, 4)]
    assert fs[0] > fs[1] > fs[2]                          # shards shrink as 1/N (plus padding)
    z = estimate_memory(prof, "zero1", 4)
    assert z.by_role["optimizer"] < ddp4.by_role["optimizer"] and z.by_role["parameters"] == ddp4.by_role["parameters"]
    with pytest.raises(ValueError, match="unknown strategy"):
        estimate_memory(prof, "zero9", 2)


def test_estimate_recipe_prints_every_strategy_and_world(capsys):
    from recipes.compare import main
    main(["--estimate", "model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=8",
          "trainer.batch_size=2", "estimate.worlds=[1,4]"])
    out = capsys.readouterr().out.splitlines()
    assert "N=4" in out[1] and [line.split()[0] for line in out[2:]] == [
        "ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "hybrid_shard"]


def test_config_errors_are_one_line():
    from recipes.compare import compose
    for bad, words in ((["strategies=[ddp,zero9]"], "zero9 not valid"), (["warmup_steps=1"], "warmup_steps >= 2"),
                       (["strategy_options.ddp.bucket_mb=1"], "valid keys here")):
        with pytest.raises(ValueError, match=words) as info:
            compose(bad)
        assert "\n" not in str(info.value)


def test_estimate_from_a_meta_model_in_fp16():
    from minidist.models.gpt import GPT, Block
    from tests.common import tiny_gpt_config
    with torch.device("meta"):
        model = GPT(tiny_gpt_config())
    x = torch.empty(2, 16, dtype=torch.long, device="meta")
    loss = lambda m, b: m(b[0], b[1])[1]  # noqa: E731
    est32 = estimate_memory(model, "full_shard", 2, batch=[x, x], loss_fn=loss, wrap={Block})
    est16 = estimate_memory(model, "full_shard", 2, torch.float16, batch=[x, x], loss_fn=loss, wrap={Block})
    assert est16.by_role["parameters"] * 2 == est32.by_role["parameters"]
    assert est16.by_role["optimizer"] < est32.by_role["optimizer"]
    with pytest.raises(ValueError, match="needs batch"):
        estimate_memory(model, "ddp", 2)

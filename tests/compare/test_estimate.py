"""The memory estimator: ZeRO's Figure 1 from the command line, and what each engine's footprint adds
to the plain model's profile (the numbers themselves are checked against torch's allocator events in
tests/compare/test_measure.py)."""

from __future__ import annotations

import pytest
import torch

from minidist.compare.estimate import estimate_memory, held, model_state_bytes
from minidist.compare.profile import profile_step
from minidist.ddp import footprint as ddp_footprint
from minidist.buckets.policy import ReducerPolicy


def test_zero_paper_figure_1_from_the_command_line(capsys):
    """Psi = 7.5B, N = 64, K = 12, fp16 parameters and gradients: 120, 31.4, 16.6, 1.9 GB. The command line
    runs in this process (--estimate starts no process group; recipes.compare is the console script's shim)."""
    from recipes.compare import main
    gb = {s: model_state_bytes(7.5e9, s, 64, 2, 2, 12)["total"] / 1e9
          for s in ("ddp", "zero1", "zero2", "full_shard")}
    assert [round(gb[s], 1) for s in ("ddp", "zero1", "zero2", "full_shard")] == [120.0, 31.4, 16.6, 1.9]
    main(["--estimate", "estimate.params=7.5e9", "estimate.worlds=[64]",
          "strategies=[ddp,zero1,zero2,shard_grad_op,full_shard]"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[-1] for line in out.splitlines()[2:]}
    assert rows == {"ddp": "120.0", "zero1": "31.4", "zero2": "16.6", "shard_grad_op": "16.6", "full_shard": "1.9"}, out
    assert "GB" in out.splitlines()[0] and "p = 2, g = 2, K = 12" in out.splitlines()[0]


def _profile(n_layer=3, batch=2):
    from minidist.models.gpt import GPT, Block
    from tests.common import tiny_gpt_config
    with torch.device("meta"):
        model = GPT(tiny_gpt_config(n_layer=n_layer))
    x = torch.empty(batch, 16, dtype=torch.long, device="meta")
    return profile_step(model, [x, x], lambda m, b: m(b[0], b[1])[1], {Block})


def test_ddp_footprint_follows_how_buckets_travel():
    """In place (CPU): no buffer, and nothing of the last step outlives it (the flight recorder keeps
    metadata only); flat buckets (accelerators): one more copy of the gradients; as bucket views: the
    gradients are the buffers."""
    prof = _profile()
    lay, p = prof.shape, prof.itemsize
    for world in (1, 2):
        cpu = ddp_footprint.held(lay, world, device_type="cpu")
        assert all(h.bytes["buffers"] == 0 for h in cpu) and cpu[0].bytes["other"] == 0
    cuda = ddp_footprint.held(lay, 2, device_type="cuda")
    assert all(h.bytes["buffers"] == lay.psi * p for h in cuda) and cuda[0].bytes["other"] == 0
    view = ddp_footprint.held(lay, 2, device_type="cuda", policy=ReducerPolicy(gradient_as_bucket_view=True))
    assert view[-1].bytes["gradients"] == 0 and view[1].plain_grads == ()
    assert ddp_footprint.held(lay, 1, reducer=False)[0].bytes == {"parameters": lay.psi * p, "optimizer": 8 * lay.psi
                                                                  + 4 * len(lay.param_numels), "buffers": 0, "other": 0}


def test_profile_and_estimate_structure():
    prof = _profile()
    assert len(prof.unit_numels) == 4 and prof.segments[0] == 0 and prof.segments[-1] == 0
    assert any(s.backward for s in prof.samples) and max(s.activations for s in prof.samples) > 0
    assert prof.shape.param_units[0] == 0 and set(prof.shape.param_units) == {0, 1, 2, 3}
    single, ddp1, ddp4 = (estimate_memory(prof, s, n) for s, n in (("single", 1), ("ddp", 1), ("ddp", 4)))
    assert single.total <= ddp1.total <= ddp4.total           # replicated; gloo packs launched buckets
    fs = [estimate_memory(prof, "full_shard", n).by_role["parameters"] for n in (1, 2, 4)]
    assert fs[0] > fs[1] > fs[2]                          # shards shrink as 1/N (plus padding)
    z = estimate_memory(prof, "zero1", 4)
    assert z.by_role["optimizer"] < ddp4.by_role["optimizer"] and z.by_role["parameters"] == ddp4.by_role["parameters"]
    zero_rows = held(prof, "zero1_broadcast", 4)
    assert [h.at.stage for h in zero_rows if h.at.phase == "optimizer"] == [0, 1]  # the update, then the broadcasts
    z1, z2 = (estimate_memory(prof, s, 4, bucket_cap_mb=0.002) for s in ("zero1", "zero2"))  # several buckets
    assert z2.by_role["optimizer"] == z1.by_role["optimizer"] and z2.total < z1.total  # + gradients sharded
    assert z.total == estimate_memory(prof, "zero2", 4).total  # one bucket: its whole gradient is alive in backward
    native = held(prof, "full_shard", 2, backend="gloo")
    assert all(h.at.phase != "post_backward" or h.at.stage == 1 for h in native)   # minidist's ring keeps no clone
    with pytest.raises(ValueError, match="unknown strategy"):
        estimate_memory(prof, "zero9", 2)


def test_estimate_recipe_prints_every_strategy_and_world():
    from minidist.compare.run import estimate_table
    from recipes.compare import compose
    out = estimate_table(compose(["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=8",
                                  "trainer.batch_size=2", "estimate.worlds=[1,4]"], estimate=True)).splitlines()
    assert "N=4" in out[1] and [line.split()[0] for line in out[2:]] == [
        "ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "hybrid_shard", "ddp+tp2"]
    assert out[-1].split()[1:] == ["-", out[-1].split()[2], "(formula)"]  # TP: the planner's formula where T | N
    sgd = estimate_table(compose(["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=8",
                                  "optim=sgd", "strategies=[ddp+tp2]", "estimate.worlds=[2]"], estimate=True))
    assert "not estimated" in sgd.splitlines()[-1]  # the formula knows AdamW in fp32 only


def test_config_errors_are_one_line():
    from recipes.compare import compose
    for bad, words in ((["strategies=[ddp,zero9]"], "zero9 not valid"), (["warmup_steps=1"], "warmup_steps >= 2"),
                       (["strategy_options.ddp.bucket_mb=1"], "valid keys here"),
                       (["estimate.precision=fp8"], "choose fp32")):
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


def test_the_comparisons_gpt_size_applies_to_the_gpt_only():
    """configs/compare_model/<model>.yaml sizes the chosen model; a model without one (resnet18) composes."""
    from recipes.compare import compose
    assert compose([], world=(2, 2)).model.n_layer == 8
    resnet = compose(["model=resnet18", "data=synthetic", "strategies=[ddp,full_shard]"], world=(2, 2))
    assert resnet.model.name == "resnet18" and "n_layer" not in resnet.model

"""parallelize_gpt's bookkeeping: what each rank holds reassembles to the plain model under the same
names (the tie kept), dropout stays consistent across tp ranks, and bad layouts fail in one line."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

from minidist.mesh import DP, TP
from minidist.tp import RankRandom, full_tensor, parallelize_gpt, sharding_of
from tests.tp.helpers import CFG, batches, models, parallel, tp_mesh


def body_reassemble(plan: dict) -> int:
    ref, model, _ = models()
    model = parallel(model, **plan)
    assert list(model.state_dict()) == list(ref.state_dict())  # checkpoint keys do not change
    assert model.lm_head.weight is model.wte.weight  # the tie survives
    ref_params = dict(ref.named_parameters())
    sharded = 0
    for name, p in model.named_parameters():
        spec = sharding_of(p)
        sharded += spec is not None
        torch.testing.assert_close(full_tensor(p, dist.group.WORLD), ref_params[name].detach(), rtol=0, atol=0,
                                   msg=lambda m: f"{name}: {m}")
    return sharded


@pytest.mark.parametrize("world", [2, 4])
def test_slices_reassemble_to_the_plain_model(run_dist, world):
    sharded = run_dist(world, body_reassemble, dict(sequence_parallel=True, vocab_parallel=True))
    # per block qkv, fc (weight + bias) and the two projections' weights; the shared embedding/head
    assert sharded == [CFG["n_layer"] * 6 + 1] * world


def body_dropout(plan: dict) -> list[float]:
    """Losses and gradient norms with dropout on, with and without activation checkpointing."""
    out = []
    for checkpointing in (False, True):
        _, model, _ = models(dropout=0.2, activation_checkpointing=checkpointing)
        model = parallel(model, **plan)
        assert isinstance(model.blocks[0].attn.attend, RankRandom)  # each rank's heads: own masks
        assert isinstance(model.blocks[0].mlp.drop, RankRandom) == bool(plan)  # own tokens only under SP
        torch.manual_seed(7)  # the same default generator on every tp rank, and in both runs
        (idx, y), = batches(1)
        loss = model(idx, y)[1]
        loss.backward()
        out += [loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()]).norm().item()]
    return out


@pytest.mark.parametrize("plan", [{}, dict(sequence_parallel=True)], ids=["tp", "tp+sp"])
def test_dropout_is_consistent_across_ranks_and_recomputation(run_dist, plan):
    results = run_dist(2, body_dropout, plan)
    losses = [r[0::2] for r in results]
    assert losses[0] == losses[1], f"tp ranks drew different masks where they must share them: {losses}"
    for loss, norm, loss_ac, norm_ac in results:  # recompute under checkpointing draws the same masks
        assert loss == pytest.approx(loss_ac, rel=1e-6) and norm == pytest.approx(norm_ac, rel=1e-5)
    assert results[0][0] != pytest.approx(_plain_loss_without_dropout(), rel=1e-3)  # dropout really ran


def _plain_loss_without_dropout() -> float:
    ref, _, _ = models()
    (idx, y), = batches(1)
    return ref(idx, y)[1].item()


def body_rank_random() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    drop = RankRandom(nn.Dropout(0.5), tp_mesh())
    mask = drop(torch.ones(256)) > 0
    return mask, torch.get_rng_state()


def test_rank_random_draws_per_rank_masks_and_keeps_the_shared_stream(run_dist):
    (mask0, state0), (mask1, state1) = run_dist(2, body_rank_random)
    assert not torch.equal(mask0, mask1), "each rank's heads or tokens need their own dropout masks"
    assert torch.equal(state0, state1), "the default generator must advance alike on every tp rank"


def body_errors() -> list[str]:
    errors = []
    mesh = tp_mesh()
    for overrides, plan in ((dict(n_head=1), {}), (dict(vocab_size=31), dict(vocab_parallel=True)),
                            (dict(block_size=15), dict(sequence_parallel=True))):
        try:
            parallelize_gpt(models(**overrides)[1], mesh, **plan)
        except ValueError as e:
            errors.append(str(e))
    model = parallel(models()[1], sequence_parallel=True)
    try:
        model(torch.zeros(2, 15, dtype=torch.long))
    except ValueError as e:
        errors.append(str(e))
    try:
        parallelize_gpt(model, mesh)
    except ValueError as e:
        errors.append(str(e))
    world = dist.get_world_size()
    for bad in (init_device_mesh("cpu", (1, world), mesh_dim_names=(DP, TP)),
                init_device_mesh("cpu", (world,), mesh_dim_names=(DP,))):
        try:
            parallelize_gpt(models()[1], bad)
        except ValueError as e:
            errors.append(str(e))
    return errors


def test_bad_layouts_fail_in_one_line(run_dist):
    for errors in run_dist(2, body_errors):
        assert len(errors) == 7 and all("\n" not in e for e in errors), errors
        heads, vocab, block, seq, twice, two_d, name = errors
        assert "n_head=1" in heads and "tp=2" in heads
        assert "vocab_size=31" in vocab and "tp=2" in vocab and "valid: 1" in vocab
        assert "block_size=15" in block
        assert "sequence of 15" in seq and "divisible by 2" in seq
        assert "already tensor-parallel" in twice
        assert "2-D mesh" in two_d and "mesh['tp']" in two_d
        assert "'dp'" in name

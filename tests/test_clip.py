"""minidist.clip on one process: the groups a norm is summed over, the scaling, the one-line refusal.
(Sums over real groups: tests/train/test_placement.py, and each engine's clip in its equivalence tests.)"""

import math

import pytest
import torch
import torch.nn as nn

from minidist import clip
from minidist.sharding import shard_param


def _param(values, grad, **declared) -> nn.Parameter:
    p = nn.Parameter(torch.tensor(values))
    p.grad = torch.tensor(grad)
    for dim, tensor_dim in declared.items():
        shard_param(p, dim, tensor_dim)
    return p


def test_groups_follow_declarations_and_every_parameter_has_a_key():
    whole, sliced, no_grad = _param([1.0], [3.0]), _param([1.0], [4.0], tp=0), _param([1.0], [1.0], tp=0)
    no_grad.grad = None
    groups = clip.norm_groups([(p, p.grad) for p in (whole, sliced, no_grad)])
    assert set(groups) == {(), ("tp",)} and [g.item() for g in groups[("tp",)]] == [4.0]
    assert set(clip.norm_groups([(whole, None)], also=("dp",))) == {("dp",)}  # ZeRO's shards: + its dimension


def test_clip_scales_to_max_norm_and_returns_the_norm():
    params = [_param([0.0, 0.0], [3.0, 0.0]), _param([0.0], [4.0])]
    none = clip.NamedGroups({}, "test", "elsewhere")  # nothing split: no collective
    total = clip.clip_grad_norm_([(p, p.grad) for p in params], 1.0, none, device=torch.device("cpu"))
    assert math.isclose(total.item(), 5.0)
    assert math.isclose(torch.cat([p.grad for p in params]).norm().item(), 1.0, rel_tol=1e-5)
    inf = clip.clip_grad_norm_([(p, p.grad) for p in params], 10.0, none, device=torch.device("cpu"),
                               norm_type=math.inf)
    assert math.isclose(inf.item(), 0.8, rel_tol=1e-5)  # below max_norm: nothing scaled
    assert math.isclose(params[1].grad.item(), 0.8, rel_tol=1e-5)


def test_a_dimension_the_engine_does_not_know_is_refused_in_one_line():
    p = _param([0.0], [1.0], tp=0)
    with pytest.raises(ValueError) as err:
        clip.clip_grad_norm_([(p, p.grad)], 1.0, clip.NamedGroups({}, "FSDP.clip_grad_norm_", "the trainer's"),
                             device=torch.device("cpu"))
    assert str(err.value) == ("FSDP.clip_grad_norm_ sums over no mesh dimension only, but some parameters are also "
                              "split over ['tp']: use the trainer's")

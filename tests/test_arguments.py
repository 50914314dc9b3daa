"""Old argument names are refused in one line naming the new ones (minidist.arguments), before any
process group is touched: FSDP's FSDP1 knobs, DDP's device_mesh= and mixed_precision=."""

import pytest
import torch
import torch.nn as nn

from minidist import DDP, FSDP


@pytest.mark.parametrize("engine,kwargs,names", [
    (FSDP, {"sharding_strategy": "shard_grad_op"}, ["reshard_after_forward=True", "('replicate', 'shard')"]),
    (FSDP, {"forward_prefetch": False, "max_inflight_all_gathers": 2}, ["set_modules_to_forward_prefetch"] * 2),
    (FSDP, {"param_dtype": torch.bfloat16}, ["mp_policy=MixedPrecisionPolicy("]),
    (DDP, {"device_mesh": None}, ["mesh="]),
    (DDP, {"mixed_precision": None}, ["mp_policy=MixedPrecisionPolicy("]),
    (DDP, {"bucket_cap": 5}, ["unexpected keyword argument(s) 'bucket_cap'"]),
])
def test_old_names_are_refused_naming_the_new(engine, kwargs, names):
    with pytest.raises(TypeError) as err:
        engine(nn.Linear(2, 2), **kwargs)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{engine.__name__}: ")
    for old, new in zip(kwargs, names):
        assert f"{old}= was renamed: use" in msg or "unexpected" in msg, msg
        assert new in msg, msg


def test_reshard_to_a_smaller_group_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"reshard_after_forward=2: True or False; an int \(FSDP2's reshard"):
        FSDP(nn.Linear(2, 2), reshard_after_forward=2)

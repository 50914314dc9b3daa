"""Cutting models into stages: the GPT by blocks under its own names, an nn.Sequential at split points,
every parameter declared split over "pp", the tie named; sizes that do not fit refused in one line."""

from __future__ import annotations

import pytest
import torch

from minidist.pp import microbatch, split_gpt, split_sequential, stages_of
from minidist.sharding import Split, sharded_over
from tests.pp.helpers import gpt, mlp


def test_gpt_stages_keep_the_model_names_and_cover_it():
    model = gpt(4)
    whole = dict(model.named_parameters(remove_duplicate=False))
    cut = split_gpt(model, 3)
    names = [list(dict(m.named_parameters(remove_duplicate=False))) for m in cut.modules]
    assert names[0][:2] == ["wte.weight", "wpe.weight"] and names[0][2].startswith("blocks.0.")
    assert names[2][-3:] == ["ln_f.weight", "ln_f.bias", "lm_head.weight"]
    assert sorted(n for ns in names for n in ns) == sorted(whole)
    blocks = [sorted({n.split(".")[1] for n in ns if n.startswith("blocks.")}) for ns in names]
    assert blocks == [["0"], ["1"], ["2", "3"]]
    assert [(t.first, t.second) for t in cut.ties] == [((0, "wte.weight"), (2, "lm_head.weight"))]
    assert all(sharded_over(p) == {"pp": Split(None, 1)} for m in cut.modules for p in m.parameters())


def test_gpt_stages_compute_the_model():
    model = gpt(4)
    idx = torch.randint(0, 31, (2, 16), generator=torch.Generator().manual_seed(1))
    x = idx
    for m in split_gpt(model, 4).modules:
        x = m(x)
    torch.testing.assert_close(x, model(idx)[0], rtol=0, atol=0)


def test_sequential_split_points():
    cut = split_sequential(mlp(8), [2, 5])
    assert [list(m._modules) for m in cut.modules] == [["0", "1"], ["2", "3", "4"], ["5", "6", "7"]]
    assert stages_of(1, 4, 2) == [1, 5]


def test_sizes_that_do_not_fit():
    with pytest.raises(ValueError, match="a GPT of n_layer=4 blocks cuts into 1 to 4 stages .pp x virtual., not 8"):
        split_gpt(gpt(4), 8)
    with pytest.raises(ValueError, match=r"split_points=\[5, 2\] must increase strictly between 1 and 7"):
        split_sequential(mlp(8), [5, 2])
    with pytest.raises(ValueError, match="microbatches=3 must divide the batch's 8 samples .*valid: 1, 2, 4, 8"):
        microbatch.split(torch.zeros(8, 2), 3)

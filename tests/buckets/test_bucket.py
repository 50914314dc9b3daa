"""One all_reduce bucket's lifecycle (minidist.buckets.bucket), in one process."""

import pytest
import torch
import torch.nn as nn

from minidist.buckets.bucket import Bucket, BucketState


def _p(n, dtype=torch.float32):
    return nn.Parameter(torch.zeros(n, dtype=dtype))


def test_lifecycle_asserts_order():
    b = Bucket(0, [_p(3), _p(4)], [0, 1], is_last=True)
    assert b.flat.numel() == 7 and b.views[1].data_ptr() == b.flat[3:].data_ptr()
    with pytest.raises(AssertionError):
        b.launch(torch.futures.Future())  # not FULL yet
    assert not b.mark_ready() and b.mark_ready() and b.state is BucketState.FULL
    fut = torch.futures.Future()
    b.launch(fut)
    fut.set_result(torch.arange(7.0))
    b.finish()
    assert b.state is BucketState.REDUCED and b.views[1].tolist() == [3.0, 4.0, 5.0, 6.0]
    b.reset()
    assert b.state is BucketState.FILLING and b.pending == 2

"""Bucket assignment and the policy (minidist.buckets.policy), shared by DDP and ZeRO: in one process."""

import pytest
import torch
import torch.nn as nn

from minidist.buckets.policy import MiB, ReducerPolicy, assign_buckets


def _p(n, dtype=torch.float32):
    return nn.Parameter(torch.zeros(n, dtype=dtype))


def test_caps_first_bucket_and_dtypes():
    params = [_p(100), _p(100), _p(100), _p(50, torch.float64), _p(300), _p(100)]
    # cap 800 B (200 floats), first bucket 400 B (100 floats)
    groups = assign_buckets(params, bucket_cap_bytes=800, first_bucket_bytes=400)
    assert groups == [[0], [1, 2], [3], [4], [5]]
    for g in groups:
        assert len({params[i].dtype for i in g}) == 1, "one dtype per bucket"
    caps = [400, 800, 400, 800, 800]  # the float64 bucket is the first of its dtype
    for g, cap in zip(groups, caps):
        before_last = sum(params[i].numel() * params[i].element_size() for i in g[:-1])
        assert before_last < cap, "a bucket closes as soon as it reaches its cap"


def test_bucket_closes_once_it_reaches_the_cap():
    # torch's rule: a small parameter followed by a large one share a bucket, which then
    # exceeds the cap; closing *before* the large one would leave a lone 40 B bucket.
    params = [_p(10), _p(300), _p(10), _p(300), _p(10)]
    assert assign_buckets(params, bucket_cap_bytes=800, first_bucket_bytes=400) == [[0, 1], [2, 3], [4]]
    assert assign_buckets(params, bucket_cap_bytes=10_000, first_bucket_bytes=400) == [[0, 1], [2, 3, 4]]


def test_tiny_and_huge_caps():
    params = [_p(n) for n in (7, 13, 29, 31)]
    assert assign_buckets(params, 1, 1) == [[0], [1], [2], [3]]
    assert assign_buckets(params, 1000 * MiB) == [[0, 1, 2, 3]]


def test_small_last_bucket():
    # the benchmark's shape, in floats: 3 blocks of (bias 10, weight 1000) ready before the input layer's (10, 60)
    params = [_p(n) for n in (10, 1000, 10, 1000, 10, 1000, 10, 60)]
    # cap 8000 B reached after two blocks; without a last cap the input layer shares a bucket with block 0
    assert assign_buckets(params, 8000, 8000) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # last cap 400 B: the trailing run within it (280 B) gets its own bucket; the one before closes early
    assert assign_buckets(params, 8000, 8000, last_bucket_bytes=400) == [[0, 1, 2, 3], [4, 5], [6, 7]]
    # at least one parameter, even over the last cap; per dtype: float64 has its own last bucket
    mixed = [_p(100), _p(100), _p(50, torch.float64), _p(300), _p(50, torch.float64), _p(60, torch.float64)]
    assert assign_buckets(mixed, 10_000, 10_000, last_bucket_bytes=500) == [[0, 1], [2, 4], [3], [5]]
    assert assign_buckets(params, 1, 1, last_bucket_bytes=1) == [[i] for i in range(8)]
    assert assign_buckets(params, 10**6, 10**6, last_bucket_bytes=10**6) == [list(range(8))]


def test_small_first_bucket_only_by_default():
    default, explicit = ReducerPolicy(), ReducerPolicy(bucket_cap_mb=5)
    assert (default.first_bucket_bytes, default.bucket_cap_bytes) == (MiB, 25 * MiB), "torch's defaults"
    assert explicit.first_bucket_bytes == explicit.bucket_cap_bytes == 5 * MiB, "an explicit cap caps every bucket"
    assert ReducerPolicy(bucket_cap_mb=0.5).first_bucket_bytes == MiB // 2
    assert default.last_bucket_bytes == explicit.last_bucket_bytes == MiB, "the exposed last bucket is small always"
    assert ReducerPolicy(bucket_cap_mb=0.5).last_bucket_bytes == MiB // 2


def test_bucket_cap_must_be_positive():
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=f"bucket_cap_mb={bad} must be > 0"):
            ReducerPolicy(bucket_cap_mb=bad)

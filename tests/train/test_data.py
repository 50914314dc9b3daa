"""Data: the stdlib corpus is deterministic and split by file; rank shards are disjoint, equal in
length, reshuffled per epoch and resumable; CIFAR-10 offline fails with a message naming the fix."""

import torch

from minidist.train.data import (BatchStream, Images, TokenWindows, is_validation, stdlib_corpus,
                                 stdlib_files, synthetic_images, synthetic_tokens, unigram_bits_per_byte)


def test_stdlib_corpus_is_deterministic_capped_and_split_by_file():
    assert stdlib_files(4_000_000)[0][0] == "pydoc_data/topics.py"  # the docs lead when they fit
    files = stdlib_files(300_000)
    assert sum(len(b) for _, b in files) <= 300_000 and len(files) > 10
    train, val = stdlib_corpus(300_000, 10)
    train2, val2 = stdlib_corpus(300_000, 10)
    assert torch.equal(train, train2) and torch.equal(val, val2)
    n_val = sum(len(b) for rel, b in files if is_validation(rel, 10))
    assert len(val) == n_val and len(train) + len(val) == sum(len(b) for _, b in files)
    assert 3.0 < unigram_bits_per_byte(train) < 6.0  # text: far below the 8 bits of uniform bytes


def _batches(stream, n):
    return [next(stream) for _ in range(n)]


def test_rank_shards_are_disjoint_equal_and_reshuffled_per_epoch():
    ds = TokenWindows(torch.arange(10 * 4 + 3) % 256, 4)  # 10 windows: world 3 keeps 9, batch 2 -> 1 batch/rank
    streams = [BatchStream(ds, 2, r, 3, seed=7) for r in range(3)]
    assert {s.batches_per_epoch for s in streams} == {1}  # same step count on every rank: no hang
    firsts = [s.ds.get(s._epoch_order(0))[0][:, 0] // 4 for s in streams]
    seen = torch.cat(firsts)
    assert len(set(seen.tolist())) == len(seen) == 9  # disjoint
    e0, e1 = streams[0]._epoch_order(0), streams[0]._epoch_order(1)
    assert not torch.equal(e0, e1)  # reshuffled
    assert torch.equal(e0, BatchStream(ds, 2, 0, 3, seed=7)._epoch_order(0))  # deterministic


def test_stream_position_resumes_exactly():
    ds = Images(*synthetic_images(40, 10, seed=1), augment=True)
    a = BatchStream(ds, 4, 1, 2, seed=3)
    _batches(a, 7)  # into the second epoch (5 batches per epoch)
    b = BatchStream(ds, 4, 1, 2, seed=3)
    b.load_state_dict(a.state_dict())
    for (xa, ya), (xb, yb) in zip(_batches(a, 6), _batches(b, 6)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)  # augmentation included


def test_synthetic_tokens_follow_a_learnable_chain():
    t = synthetic_tokens(5000, 64, seed=0)
    pairs = torch.stack([t[:-1], t[1:]], 1)
    # most transitions repeat: the next token is predictable from the current one
    _, counts = torch.unique(pairs, dim=0, return_counts=True)
    assert counts.max() > 30 and len(counts) < 2000


def _cifar_offline(root: str) -> str:
    from minidist import runtime
    from minidist.train.data import cifar10
    try:
        cifar10(root, download=True, group=runtime.init("gloo").group)
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_cifar_offline_error_names_the_settings(run_dist, tmp_path):
    msgs = run_dist(2, _cifar_offline, str(tmp_path / "data" / "cifar"), timeout=120)
    for msg in msgs:  # every rank fails the same way, nobody hangs
        assert "data.root" in msg and "data.download=false" in msg and "\n" not in msg, msg
        assert "set data.download=true" not in msg, msg  # it already is
    assert not (tmp_path / "data").exists()  # the failed download leaves no empty directories

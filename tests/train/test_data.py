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


def _ids(ds, stream) -> list[int]:
    """Window indices of the stream's next batch (TokenWindows over arange: first token // block)."""
    return (next(stream)[0][:, 0] // 4).tolist()


def test_rank_shards_are_disjoint_equal_and_reshuffled_per_epoch():
    ds = TokenWindows(torch.arange(10 * 4 + 3) % 256, 4)  # 10 windows: world 3, batch 3 -> one global batch of 9
    streams = [BatchStream(ds, 3, r, 3, seed=7) for r in range(3)]
    assert {s.batches_per_epoch for s in streams} == {1}  # same step count on every rank: no hang
    epoch0 = [_ids(ds, s) for s in streams]
    seen = [i for ids in epoch0 for i in ids]
    assert len(set(seen)) == len(seen) == 9  # disjoint, equal
    epoch1 = [_ids(ds, s) for s in streams]
    assert epoch0 != epoch1  # reshuffled
    assert epoch0[0] == _ids(ds, BatchStream(ds, 3, 0, 3, seed=7))  # deterministic


def test_stream_position_resumes_exactly():
    ds = Images(*synthetic_images(40, 10, seed=1), augment=True)
    a = BatchStream(ds, 4, 1, 2, seed=3)
    _batches(a, 7)  # into the second epoch (5 batches per epoch)
    b = BatchStream(ds, 4, 1, 2, seed=3)
    b.load_state_dict(a.state_dict())
    for (xa, ya), (xb, yb) in zip(_batches(a, 6), _batches(b, 6)):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)  # augmentation included


def test_position_saved_at_two_ranks_continues_at_one_and_four():
    ds = TokenWindows(torch.arange(64 * 4 + 1) % 256, 4)  # 64 windows
    two = [BatchStream(ds, 4, r, 2, seed=5) for r in range(2)]
    for s in two:
        _batches(s, 3)  # 3 global batches of 8 consumed
    state = two[0].state_dict()
    assert state == two[1].state_dict() == {"epoch": 0, "offset": 24}
    next_global = sorted(i for s in two for i in _ids(ds, s))  # what 2 ranks take next (8 windows)
    one = BatchStream(ds, 8, 0, 1, seed=5)  # same global batch of 8 on one rank
    one.load_state_dict(state)
    assert sorted(_ids(ds, one)) == next_global
    four = [BatchStream(ds, 2, r, 4, seed=5) for r in range(4)]
    for s in four:
        s.load_state_dict(state)
    assert sorted(i for s in four for i in _ids(ds, s)) == next_global


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


def test_strided_windows_score_every_token_once_with_context():
    """eval_stride: each token after the first is a scored target exactly once, and (after the first
    window) with at least block - stride tokens before it in its window."""
    from minidist.train.data import IGNORE
    tokens = torch.arange(50)
    block, stride = 8, 3
    ds = TokenWindows(tokens, block, stride)
    x, y = ds.get(torch.arange(len(ds)))
    scored = y[y != IGNORE]
    assert sorted(scored.tolist()) == list(range(1, len(scored) + 1))  # once each, none skipped
    assert len(scored) > len(tokens) - 1 - stride  # at most the tail shorter than a stride is left out
    pos = (y != IGNORE).nonzero()[:, 1]
    assert pos[block:].min() == block - stride  # after the first window: block - stride tokens of context
    assert torch.equal(TokenWindows(tokens, block, block).get(torch.arange(6))[1],
                       TokenWindows(tokens, block).get(torch.arange(6))[1])  # stride = block: as before
    # the validation sums count the scored targets only: [loss summed over them, how many]
    from minidist.models import GPT, GPTConfig
    from minidist.train.task import LanguageModeling
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=block, n_layer=1, n_head=1, n_embd=8))
    with torch.no_grad():
        sums = LanguageModeling.eval_sums(model, [x, y])
        logits, _ = model(x)
    keep = y != IGNORE
    direct = torch.nn.functional.cross_entropy(logits[keep], y[keep], reduction="sum")
    assert sums[1] == keep.sum() and torch.allclose(sums[0], direct.double(), rtol=1e-5)

"""Datasets the recipes train on, and the per-rank stream of batches.

Three sources, all in memory as tensors (minidist.train.data_sources): stdlib (this
interpreter's standard library source, byte-level), cifar10 (torchvision's CIFAR-10) and
synthetic (tokens or images from a seed, learnable). Here they become datasets: windows of
tokens (TokenWindows) or images (Images), each answering get(indices).

Sharding (BatchStream): each epoch, one permutation of all sample indices is drawn
from (seed, epoch) - the same on every rank - and each global batch is split so that
rank r takes every world-th index starting at r. The stream's position (epoch,
samples consumed) is all a checkpoint needs to continue it, at any world size.
"""

from __future__ import annotations

import torch

from minidist.train.data_sources import (cifar10, is_validation, stdlib_corpus, stdlib_files,  # noqa: F401
                                         synthetic_images, synthetic_tokens, unigram_bits_per_byte)
# the sources stay importable from here, where the tests and scripts take them (data_sources is their home)


# ------------------------------------------------------------------ datasets
IGNORE = -100
"""A target that scores nothing: nn.CrossEntropyLoss's default ignore_index (and the vocabulary-parallel loss's)."""


class TokenWindows:
    """Windows of block_size+1 tokens: x = window[:-1], y = window[1:]; non-overlapping by default.

    stride (validation): windows start every `stride` tokens and each scores only the targets the
    previous one did not (the first window all of them; the others' first block_size - stride
    targets are IGNORE), so every token is scored once and, after the first window, with at least
    block_size - stride tokens of context instead of 0 to block_size - 1. Non-overlapping windows
    score the first token of each window with no context at all: the held-out bits per byte of a
    model, measured so, mix in how well it guesses from nothing. Cost: block_size / stride times
    the forward passes of non-overlapping windows.
    """

    def __init__(self, tokens: torch.Tensor, block_size: int, stride: int | None = None):
        self.tokens, self.block = tokens.long(), block_size
        self.stride = stride or block_size
        if not 0 < self.stride <= block_size:
            raise ValueError(f"stride={stride} must be in 1..block_size={block_size}")
        if len(tokens) < block_size + 1:
            raise ValueError(f"{len(tokens)} tokens do not fill one block of {block_size}")
        self.n = (len(tokens) - 1 - block_size) // self.stride + 1

    def __len__(self) -> int:
        return self.n

    def get(self, idx: torch.Tensor, generator: torch.Generator | None = None):
        rows = idx.view(-1, 1) * self.stride + torch.arange(self.block + 1).view(1, -1)  # (b, block+1)
        w = self.tokens[rows]
        x, y = w[:, :-1], w[:, 1:]
        if self.stride < self.block:  # scored by the window before: not again
            y = y.clone()
            y[:, :self.block - self.stride].masked_fill_(idx.view(-1, 1) > 0, IGNORE)
        return x, y


class Images:
    """Images (N, 3, 32, 32) and labels, with optional random crop (pad 4) + flip on get()."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, augment: bool = False):
        self.x, self.y, self.augment = x, y, augment

    def __len__(self) -> int:
        return len(self.y)

    def get(self, idx: torch.Tensor, generator: torch.Generator | None = None):
        x, y = self.x[idx], self.y[idx]
        if self.augment and generator is not None:
            b = len(idx)
            padded = torch.nn.functional.pad(x, (4, 4, 4, 4))
            dx, dy = torch.randint(9, (2, b), generator=generator)
            x = torch.stack([padded[i, :, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32] for i in range(b)])
            flip = torch.rand(b, generator=generator) < 0.5
            x[flip] = x[flip].flip(-1)
        return x, y


# ------------------------------------------------------------------- stream
class BatchStream:
    """This rank's endless sequence of batches: disjoint shards, reshuffled every epoch.

    Each epoch is one permutation of the dataset, the same on every rank. A step of the
    whole job takes the next batch_size x world entries of it, and rank r gets every
    world-th of those, starting at r. So the position is one number for the whole job,
    `offset` (samples of this epoch consumed by all ranks together), and a checkpoint
    written at N ranks continues at M: the next global batch starts at the same offset
    and is split M ways. The tail of an epoch that does not fill a whole global batch is
    dropped, so all ranks run the same number of steps (a rank that ran out one step
    early would leave the others waiting in their all_reduce).
    """

    def __init__(self, dataset, batch_size: int, rank: int, world: int, seed: int, shuffle: bool = True):
        self.ds, self.bs, self.rank, self.world, self.seed, self.shuffle = dataset, batch_size, rank, world, seed, shuffle
        self.global_batch = batch_size * world
        self.batches_per_epoch = len(dataset) // self.global_batch
        if self.batches_per_epoch < 1:
            raise ValueError(f"{len(dataset)} samples cannot give every one of {world} ranks a batch of "
                             f"{batch_size}; lower trainer.batch_size or use more data")
        self.epoch, self.offset = 0, 0
        self._perm: torch.Tensor | None = None

    def _permutation(self, epoch: int) -> torch.Tensor:
        n = len(self.ds)
        return (torch.randperm(n, generator=torch.Generator().manual_seed(self.seed * 100_003 + epoch))
                if self.shuffle else torch.arange(n))

    def __iter__(self):
        return self

    def __next__(self):
        if self._perm is None:
            self._perm = self._permutation(self.epoch)
        step = self._perm[self.offset:self.offset + self.global_batch]
        idx = step[self.rank::self.world]
        g = torch.Generator().manual_seed(((self.seed * 1_000_003 + self.epoch) * 1_000_003 + self.offset) * 1009
                                          + self.rank)
        batch = self.ds.get(idx, g)
        self.offset += self.global_batch
        if self.offset + self.global_batch > len(self.ds):
            self.epoch, self.offset, self._perm = self.epoch + 1, 0, None
        return batch

    def state_dict(self) -> dict:
        """The job's position: the same on every rank, valid at any world size."""
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, sd: dict) -> None:
        self.epoch, self.offset, self._perm = int(sd["epoch"]), int(sd["offset"]), None
        if self.offset + self.global_batch > len(self.ds):  # saved at a world where one more batch fitted
            self.epoch, self.offset = self.epoch + 1, 0

    def one_pass(self, max_batches: int | None = None):
        """Validation: this rank's shard in a fixed order, at most max_batches batches (same count on every rank)."""
        order = self._permutation(0)[self.rank:self.batches_per_epoch * self.global_batch:self.world]
        n = self.batches_per_epoch if max_batches is None else min(max_batches, self.batches_per_epoch)
        for b in range(n):
            yield self.ds.get(order[b * self.bs:(b + 1) * self.bs])


def build_datasets(cfg, topo) -> tuple[object, object, dict]:
    """(train dataset, val dataset, info) for cfg.data and cfg.model. info: e.g. the unigram baseline."""
    d, m = cfg.data, cfg.model
    info: dict = {}
    if d.source == "stdlib":
        train, val = stdlib_corpus(d.max_bytes, d.val_percent)
        info = {"train_bytes": len(train), "val_bytes": len(val), "unigram_bpb": unigram_bits_per_byte(train)}
        return TokenWindows(train, m.block_size), TokenWindows(val, m.block_size, _stride(cfg)), info
    if d.source == "synthetic" and m.name == "gpt":
        n_train, n_val = d.train_samples * m.block_size + 1, d.val_samples * m.block_size + 1
        toks = synthetic_tokens(n_train + n_val, m.vocab_size, d.seed)
        val = TokenWindows(toks[n_train:], m.block_size, _stride(cfg))
        return TokenWindows(toks[:n_train], m.block_size), val, info
    if d.source == "synthetic":
        x, y = synthetic_images(d.train_samples + d.val_samples, m.num_classes, d.seed)
        k = d.train_samples
        return Images(x[:k], y[:k]), Images(x[k:], y[k:]), info
    if d.source == "cifar10":
        splits = cifar10(d.root, d.download, topo.group, topo.device)
        return Images(*splits["train"], augment=d.augment), Images(*splits["val"]), info
    raise ValueError(f"unknown data.source={d.source!r}")


def _stride(cfg) -> int:
    """The validation windows' stride (GPT): trainer.eval_stride, at most block_size; 0 means block_size."""
    block = cfg.model.block_size
    return min(cfg.trainer.eval_stride or block, block)

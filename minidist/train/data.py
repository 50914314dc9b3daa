"""Datasets the recipes train on, and the per-rank stream of batches.

Three sources, all in memory as tensors (they are small):

  stdlib     this interpreter's standard library source (+ pydoc's topic docs), as bytes:
             always present, no download. Byte-level, so vocab = 256.
  cifar10    torchvision's CIFAR-10, downloaded when allowed and online.
  synthetic  generated from a seed: tokens from a noisy fixed permutation chain, or
             images whose class decides a mean pattern. Learnable, so loss falls.

Sharding (BatchStream): each epoch, one permutation of all sample indices is drawn
from (seed, epoch) - the same on every rank - and each global batch is split so that
rank r takes every world-th index starting at r. The stream's position (epoch,
samples consumed) is all a checkpoint needs to continue it, at any world size.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from minidist import comm

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings", "lib2to3"}
TOPICS = "pydoc_data/topics.py"


# ------------------------------------------------------------------- sources
def _path_hash(relpath: str) -> int:
    return int.from_bytes(hashlib.md5(relpath.encode()).digest()[:4], "little")


def stdlib_files(max_bytes: int) -> list[tuple[str, bytes]]:
    """(relative path, bytes) of the corpus, at most max_bytes in all.

    Files are taken in the order of a hash of their path - a fixed shuffle, so a
    small cap still samples the whole library rather than its first letters -
    with pydoc's topic docs first when they take at most half the cap. A file
    that would overflow the cap is skipped; smaller later ones may still fit.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    rels = sorted(_python_files(root))
    rels.sort(key=_path_hash)
    if TOPICS in rels and (root / TOPICS).stat().st_size <= max_bytes // 2:
        rels.remove(TOPICS)
        rels.insert(0, TOPICS)
    out, total = [], 0
    for rel in rels:
        size = (root / rel).stat().st_size
        if total + size <= max_bytes:
            out.append((rel, (root / rel).read_bytes()))
            total += size
    if not out:
        raise RuntimeError(f"no standard-library source fits data.max_bytes={max_bytes} under {root}")
    return out


def _python_files(root: Path) -> list[str]:
    """Relative paths of the .py files under root, outside _SKIP_DIRS. os.walk prunes a skipped
    directory instead of listing it (site-packages and test/ are most of the tree): 2 ms, not the
    0.4-0.8 s of Path.rglob, which every training run paid again (the suite starts dozens)."""
    found = []
    for folder, dirs, files in os.walk(root):  # symlinked directories are not entered, as rglob's
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        rel = Path(folder).relative_to(root).as_posix()
        found += [name if rel == "." else f"{rel}/{name}" for name in files if name.endswith(".py")]
    return found


def is_validation(relpath: str, val_percent: int) -> bool:
    """A file belongs to validation when the hash of its path falls below val_percent (stable across runs)."""
    return (_path_hash(relpath) >> 8) % 100 < val_percent  # other bits than the ordering uses


def stdlib_corpus(max_bytes: int, val_percent: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and validation byte tensors (uint8, 1-D) of the standard-library corpus."""
    train, val = bytearray(), bytearray()
    for rel, data in stdlib_files(max_bytes):
        (val if is_validation(rel, val_percent) else train).extend(data)
    if not val:
        raise RuntimeError(f"data.val_percent={val_percent} left the validation split empty; raise it")
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).clone()  # noqa: E731
    return as_tensor(train), as_tensor(val)


def unigram_bits_per_byte(data: torch.Tensor) -> float:
    """Entropy of the byte histogram, in bits: the loss of the best model that ignores context."""
    p = torch.bincount(data.long(), minlength=256).double()
    p = p[p > 0] / p.sum()
    return float(-(p * p.log2()).sum())


def synthetic_tokens(n_tokens: int, vocab: int, seed: int) -> torch.Tensor:
    """A chain: next = perm[cur] with probability 0.9, else a uniform token. Learnable; ~0.5 nats floor."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(vocab, generator=g)
    perm = perm.tolist()
    noise = torch.randint(vocab, (n_tokens,), generator=g).tolist()
    keep = (torch.rand(n_tokens, generator=g) < 0.9).tolist()
    out = [noise[0]]
    for i in range(1, n_tokens):  # sequential by nature: plain Python lists are fastest here
        out.append(perm[out[-1]] if keep[i] else noise[i])
    return torch.tensor(out)


def synthetic_images(n: int, num_classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images (n, 3, 32, 32) = class pattern + noise, and labels (n,)."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(num_classes, 3, 32, 32, generator=g)
    labels = torch.randint(num_classes, (n,), generator=g)
    return patterns[labels] + 0.5 * torch.randn(n, 3, 32, 32, generator=g), labels


CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def cifar10(root: str, download: bool, group=None, device=None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """CIFAR-10 as normalised float tensors. Rank 0 downloads; every rank learns whether it worked."""
    import torch.distributed as dist
    from torchvision.datasets import CIFAR10

    def load():
        return {split: CIFAR10(root, train=(split == "train"), download=download and dist.get_rank() == 0)
                for split in ("train", "val")}

    err = ""
    if dist.get_rank() == 0:
        created = [p for p in (Path(root), *Path(root).parents) if not p.exists()]  # deepest first
        try:
            load()
        except Exception as exc:  # noqa: BLE001 - offline, missing or corrupt: one message
            err = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            for d in created:  # a failed download leaves no empty data/cifar10/ behind
                try:
                    d.rmdir()
                except OSError:  # not empty (a partial download) or already gone: keep it
                    break
    failed = torch.tensor([1 if err else 0], device=device)
    comm.broadcast(failed, src=0, group=group)
    if failed.item():
        if download:
            how = ("the download failed (is this machine offline?); point data.root at a directory holding "
                   "cifar-10-batches-py (a local copy) and set data.download=false")
        else:
            how = ("data.download=false; point data.root at a directory holding cifar-10-batches-py (a local "
                   "copy), or set data.download=true on a machine with internet")
        raise RuntimeError(f"CIFAR-10 is not under data.root={root!r} and {how} [{err}]")
    out = {}
    mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    for split, ds in load().items():
        x = torch.from_numpy(ds.data).permute(0, 3, 1, 2).float().div_(255)
        out[split] = ((x - mean) / std, torch.tensor(ds.targets))
    return out


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

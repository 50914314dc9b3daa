"""The data the recipes train on, as tensors in memory (they are small): where the samples come from.

  stdlib     this interpreter's standard library source (+ pydoc's topic docs), as bytes:
             always present, no download. Byte-level, so vocab = 256. Split into train and
             validation by file (a hash of the path), so no file is in both.
  cifar10    torchvision's CIFAR-10, downloaded when allowed and online.
  synthetic  generated from a seed: tokens from a noisy fixed permutation chain, or
             images whose class decides a mean pattern. Learnable, so loss falls.

minidist.train.data turns them into datasets (token windows, images) and every rank's stream.
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from pathlib import Path

import torch

from minidist import comm

_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "encodings", "lib2to3"}
TOPICS = "pydoc_data/topics.py"


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

"""Shim: the training recipe lives in minidist.recipes.train (installed as `minidist-train`).

    torchrun --standalone --nproc_per_node=2 -m recipes.train strategy=full_shard
"""

from minidist.recipes.train import main

__all__ = ["main"]

if __name__ == "__main__":
    main()

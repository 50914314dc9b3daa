"""Shim: the training recipe lives in minidist.recipes.train (installed as `minidist-train`).

    torchrun --standalone --nproc_per_node=2 -m recipes.train strategy=full_shard
"""

from minidist.recipes.train import check_command_line, main

__all__ = ["check_command_line", "main"]

if __name__ == "__main__":
    main()

"""Shim: the strategy comparison lives in minidist.recipes.compare (installed as `minidist-compare`).

    torchrun --standalone --nproc_per_node=2 -m recipes.compare
"""

from minidist.recipes.compare import check_command_line, compose, main

__all__ = ["check_command_line", "compose", "main"]

if __name__ == "__main__":
    main()

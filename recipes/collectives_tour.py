"""Shim: the collectives tour lives in minidist.recipes.collectives_tour (installed as `minidist-tour`).

    torchrun --standalone --nproc_per_node=2 recipes/collectives_tour.py
"""

import os
import sys

if __name__ == "__main__":
    # run as a file (python recipes/collectives_tour.py): make the checkout importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from minidist.recipes.collectives_tour import main
    main()

"""The programs users run: `train` (the Hydra training recipe), `collectives_tour` and `compare`.

Installed as console scripts (minidist-train, minidist-tour, minidist-compare) and runnable as modules
(`torchrun -m minidist.recipes.train`); the repository's recipes/*.py are thin shims
over these so that `torchrun -m recipes.train` keeps working from a checkout.
"""

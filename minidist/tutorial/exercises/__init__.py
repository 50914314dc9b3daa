"""The build-it track's exercises: one stub per rung, signatures and docstrings only.

Copy a stub, fill it in, and check it against the same equivalence, byte and memory tests the
solutions (minidist/tutorial/*.py) pass:

    cp minidist/tutorial/exercises/ddp_naive.py mine.py
    python -m minidist.tutorial.check ddp_naive mine.py        # one line per check; exit 0 when all pass

Each page of the track (docs/tutorial/) states the problem; `python -m minidist.tutorial.check --list`
names every rung, its stub and its solution. Every stub raises NotImplementedError, so every check
fails on it until you have written the rung (tests/tutorial/test_check.py proves both ways).
"""

"""Check your own implementation of a rung of the build-it track, with the tests its solution passes.

    python -m minidist.tutorial.check ddp_bucketed path/to/mine.py        # N = 2 gloo processes
    python -m minidist.tutorial.check fsdp mine.py --world 4
    python -m minidist.tutorial.check --list                              # the rungs, their stubs

It starts its own world (spawned gloo processes, bounded in time), imports your file on every
rank and prints one line per check, PASS or FAIL with the numbers behind the verdict; the exit
status is 0 when every check passes, 1 otherwise, 64 on a bad command line. The checks are the
ones the track's own solutions pass (tests/tutorial/test_check.py proves each solution passes and
each stub fails), and they measure with instruments minidist does not own:

    equivalence   K steps at N ranks equal one process on the whole batch (or torch's optimizer)
    collectives   counted from torch's profiler (c10d operator events), and their order against
                  a model whose layers sleep in backward (emulated accelerator compute)
    bytes         what the kernel saw each process write to gloo's sockets (minidist.comm.kernel_io)
    memory        torch's MemTracker: every tensor storage created, resized and freed (instruments.py
                  says why not the profiler's allocator events: frees on gloo's threads go unseen)

Modules: rungs (the registry, loading your file, running the checks), ddp, zero, fsdp, tp, pp, cp
(each rung's checks), instruments (profiler, MemTracker, kernel), models (the checker's models and data), world
(the spawned processes), verdict (a check and its result).
"""

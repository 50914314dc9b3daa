"""One rank of a two-rank gloo world in which rank 1 skips collectives (test-only fault injection).

    python -m tests.comm.hang_worker RANK STORE_FILE RUN_DIR

The world joins with a long timeout (process start-up under load varies by
seconds); two groups, `first` and `second`, get a 2 s one (1 s after the
SIGUSR1 below; each hang costs the test its timeout). Both ranks issue
all_reduce #1 and broadcast #2 on `first`; then rank 1 sleeps (the test kills
it) while rank 0:
  1. issues all_reduce #3 on `first`, blocking; it sends itself SIGUSR1 1 s
     in, while its main thread is inside gloo; the timeout is caught and its
     message printed as the recipes would print it;
  2. issues all_reduce #1 on `second`, async, and waits on it; the timeout
     reaches runtime.exit_on_error after the process group is destroyed, as
     in recipes.train.
Before each stage it prints "entering <stage> at <time>" to stdout.
"""

import datetime
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

from minidist import comm, runtime

TIMEOUT_S = 2


def main() -> None:
    rank, store_file, run_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    timeout = datetime.timedelta(seconds=TIMEOUT_S)
    dist.init_process_group("gloo", store=dist.FileStore(store_file, 2), rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    first, second = dist.new_group([0, 1], timeout=timeout), dist.new_group([0, 1], timeout=timeout)
    comm.flight_recorder.install_dump_handlers(run_dir)
    x = torch.ones(4)
    try:
        comm.all_reduce(x, group=first)
        comm.broadcast(x, src=0, group=first)
        if rank == 1:
            time.sleep(60)  # never reaches all_reduce #3
            return
        print("entering sync at", time.time(), flush=True)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        try:
            comm.all_reduce(x, group=first)
        except comm.CollectiveTimeoutError as exc:
            print(f"{runtime.rank_prefix()}error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        print("entering async at", time.time(), flush=True)
        comm.all_reduce(x, group=second, async_op=True).wait()
    except Exception as exc:  # noqa: BLE001 - what recipes.train does: the process group is gone by then
        runtime.shutdown()
        runtime.exit_on_error(exc)
    runtime.exit_process(0)


if __name__ == "__main__":
    main()

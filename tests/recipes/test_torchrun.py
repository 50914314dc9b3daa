"""minidist.recipes.torchrun's statuses: a failed worker's own, 75 when the workers checkpointed on
torchrun's signal, 128 + n for a signal that ended a worker or a job that did not checkpoint; its
Ctrl-C (SIGINT taken from torchrun, a second one kills the workers). (The whole path runs in
test_launch.py's Ctrl-C and SLURM tests and test_bad_inputs.py's launcher tests.)"""

import signal
import subprocess
import sys

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from minidist.recipes.torchrun import _failed_status, _signalled_status, without_sigint


def _failed(*exitcodes: int) -> ChildFailedError:
    failures = {rank: ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=code, error_file="<N/A>")
                for rank, code in enumerate(exitcodes)}
    return ChildFailedError("recipes.train", failures)


def test_a_failed_worker_gives_its_status(capfd):
    assert _failed_status(_failed(64, -15)) == 64  # rank 0 said what was wrong; torchrun then ended rank 1
    assert _failed_status(_failed(-15, 1)) == 1  # rank 1 crashed; rank 0 was ended by torchrun
    assert capfd.readouterr().err == ""
    assert _failed_status(_failed(-15, -9)) == 128 + 9
    assert capfd.readouterr().err == "torchrun: rank 1 (pid 101) was killed by SIGKILL\n"
    assert _failed_status(_failed(-9)) == 128 + 9
    assert capfd.readouterr().err == "torchrun: rank 0 (pid 100) was killed by SIGKILL\n"


def test_a_signalled_job_exits_75_only_if_its_workers_checkpointed(tmp_path):
    assert _signalled_status(signal.SIGTERM, tmp_path) == 128 + 15  # no worker said anything: killed
    (tmp_path / "rank0").write_text("75")
    (tmp_path / "rank1").write_text("75")
    assert _signalled_status(signal.SIGTERM, tmp_path) == 75


def test_sigint_is_taken_from_torchrun_unless_the_user_left_it_out():
    from torch.distributed import run as torchrun

    def rewrite(*argv: str) -> list[str]:
        args = torchrun.parse_args(list(argv))
        return without_sigint(args, list(argv), list(argv[:len(argv) - len(args.training_script_args)]))

    assert rewrite("--standalone", "--nproc_per_node=2", "-m", "recipes.train", "a=1") == [
        "--standalone", "--nproc_per_node=2", "--signals-to-handle=SIGTERM,SIGHUP,SIGQUIT", "-m", "recipes.train",
        "a=1"]
    assert rewrite("--nproc_per_node", "2", "train.py", "--lr", "1") == [
        "--nproc_per_node", "2", "--signals-to-handle=SIGTERM,SIGHUP,SIGQUIT", "train.py", "--lr", "1"]
    mine = ["--signals-to-handle=SIGTERM,SIGUSR1", "-m", "recipes.train"]
    assert rewrite(*mine) == mine  # the user's list, without SIGINT: torchrun's own handling stays


SECOND_CTRL_C = """
import signal, subprocess
from torch.distributed.elastic.multiprocessing.api import SignalException
from minidist.recipes.torchrun import CtrlC
worker = subprocess.Popen(["sleep", "60"], start_new_session=True)  # as torch starts its workers
ctrl_c = CtrlC(SignalException)
try:
    ctrl_c(signal.SIGINT, None)
except SignalException:
    print("first: torchrun's", worker.poll())
ctrl_c(signal.SIGINT, None)
print("second:", worker.wait(timeout=10), ctrl_c.killed)
"""


@pytest.mark.launches
def test_a_second_ctrl_c_kills_the_workers():
    """In a process of its own: CtrlC kills this process's children, and pytest's are the worker pool."""
    p = subprocess.run([sys.executable, "-c", SECOND_CTRL_C], capture_output=True, text=True, timeout=60)
    assert p.stdout.splitlines() == ["first: torchrun's None", "second: -9 1"], p.stdout + p.stderr
    assert p.stderr.splitlines() == ["torchrun: stopped at once (a second Ctrl-C): 1 worker(s) killed, without a "
                                     "checkpoint of the step in progress; the latest complete checkpoint is kept"]

"""minidist.recipes.torchrun's statuses: a failed worker's own, 75 when the workers checkpointed on
torchrun's signal, 128 + n for a signal that ended a worker or a job that did not checkpoint. (The
whole path runs in test_launch.py's SLURM test and test_bad_inputs.py's launcher test.)"""

import signal

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from minidist.recipes.torchrun import _failed_status, _signalled_status


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

"""The recipe as users launch it: two rendezvous agents (multi-node on one machine) running to the end,
and a SLURM job whose crashed worker torchrun restarts and which is then preempted and requeued. Each
subprocess has a timeout; models are tiny. launch/local.sh's command line is checked, without starting
a worker, by tests/recipes/test_bad_inputs.py."""

import contextlib
import io
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from minidist import runtime
from minidist.train import train
from minidist.train.metrics import read_metrics
from tests.harness import compose_once

REPO = Path(__file__).resolve().parents[2]
TINY = ["experiment=gpt_tiny", "trainer.steps=12", "trainer.log_interval=2", "data.max_bytes=200000"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable, PYTHONWARNINGS="default")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd, cwd, env, out: Path, err: Path) -> subprocess.Popen:
    """A launcher in a session of its own, so that _end can take its workers down with it."""
    with open(out, "w") as fo, open(err, "w") as fe:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=fo, stderr=fe, start_new_session=True)


def _end(proc: subprocess.Popen) -> None:
    """Kill whatever the launcher left running (killing a shell or torchrun alone orphans the workers)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _noise(stderr: str) -> list[str]:
    """Lines that would be a warning or a traceback in normal use."""
    return [ln for ln in stderr.splitlines()
            if "Warning" in ln or "Traceback" in ln or ln.startswith("wandb:")]


@pytest.mark.launches
def test_two_agents_rendezvous_as_two_nodes_and_the_run_finishes(tmp_path):
    env = ENV | {"NNODES": "2", "NPROC": "1", "MASTER": f"127.0.0.1:{_free_port()}", "RUN": "twonode"}
    cmd = ["bash", str(REPO / "launch/multinode.sh"), *TINY, f"out_dir={tmp_path}", "logger.mode=offline"]
    # Output goes to files, not pipes: c10d hands rank 0 (the chatty one) to either agent, and a
    # pipe nobody reads while we wait on the other agent fills up and blocks it mid-run.
    logs = [(tmp_path / f"agent{n}.out", tmp_path / f"agent{n}.err") for n in range(2)]
    procs = [_start(cmd, REPO, env | {"NODE_RANK": str(n)}, out, err) for n, (out, err) in enumerate(logs)]
    try:
        for proc in procs:
            proc.wait(timeout=240)
    finally:
        for proc in procs:
            _end(proc)
    outs = [(out.read_text(), err.read_text()) for out, err in logs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    run = tmp_path / "twonode"
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[-1]["step"] == 12 and rows[-1]["final/loss"] < rows[0]["train/loss"]
    assert {r["step"] for r in rows if "train/loss" in r} >= {2, 4, 6, 8, 10, 12}
    assert any("comm/all_reduce_bytes" in r for r in rows)  # the traced step's collectives
    assert "final" in outs[0][0] + outs[1][0]
    assert (run / "curves.png").stat().st_size > 0 and (run / ".hydra" / "config.yaml").exists()
    assert list((run / "wandb").glob("offline-run-*")), "wandb (offline) writes inside the run dir"
    assert not _noise(outs[0][1] + outs[1][1]), outs


@pytest.mark.launches
def test_slurm_job_restarts_a_crashed_worker_then_requeues_when_preempted(tmp_path):
    """launch/slurm.sbatch as SLURM runs it, with srun and scontrol stood in for. The main process crashes
    before step 4 (tests.recipes.crashing_train; a callback, so after step 3 and before its checkpoint would
    be written): torchrun restarts both workers, which rendezvous on their first try (minidist.runtime
    prefixes the store keys per attempt; see _restart_safe_store) and resume from the step-2 checkpoint. Then the time-limit SIGTERM reaches the script, torchrun forwards it, the
    workers checkpoint and exit 75, torchrun (through minidist.recipes.torchrun) exits 75 without a
    traceback, and the script requeues the job."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (fake / "scontrol").write_text('#!/bin/bash\n[ "$1" = show ] && { echo localhost; exit 0; }\n'
                                   'echo "$@" >> "$SCONTROL_LOG"\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    env = ENV | {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO), "NPROC": "2",
                 "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "RUN": "pre",
                 "SLURM_SUBMIT_DIR": str(tmp_path), "PORT": str(_free_port()), "SCONTROL_LOG": str(tmp_path / "sc"),
                 "MAX_RESTARTS": "1", "CKPT_INTERVAL": "2", "ENTRY": "tests.recipes.crashing_train",
                 "CRASH_AT_STEP": "4"}
    cmd = ["bash", str(REPO / "launch/slurm.sbatch"), "experiment=gpt_tiny", "trainer.steps=100000",
           "trainer.log_interval=1", "data.max_bytes=200000", f"out_dir={tmp_path}", "logger.mode=disabled"]
    run = tmp_path / "pre"

    def resumed_and_stepping() -> bool:  # the restarted attempt resumed and logged a step after the crash
        metrics = run / "metrics.jsonl"
        return ("resumed from step 2" in (tmp_path / "out").read_text() and metrics.exists()
                and max((r["step"] for r in read_metrics(metrics)), default=0) >= 4)

    proc = _start(cmd, tmp_path, env, tmp_path / "out", tmp_path / "err")
    try:
        deadline = time.monotonic() + 180
        while not resumed_and_stepping():
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "err").read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # --signal=B:TERM@120: SLURM signals the batch shell
        assert proc.wait(timeout=120) == 0
    finally:
        _end(proc)
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert "Connection refused" not in err, err
    assert (run / "crash_injected").exists() and "injected crash before step 4" in err, out + err
    step = int((run / "PREEMPTED").read_text())
    assert step >= 4 and f"preempted (SIGTERM) after step {step}, checkpoint saved" in out, out + err
    assert "preempted (checkpoint saved); requeueing job 4242" in out, out + err  # the workers exited 75
    assert (tmp_path / "sc").read_text().split() == ["requeue", "4242"]
    assert (run / "checkpoints" / f"step_{step:07d}" / "COMPLETE").exists()
    assert not _noise(err.replace("injected crash", "")), _noise(err)


def _resume_and_uninterrupted(out: str, resume: list[str], overrides: list[str]) -> tuple | None:
    """The run resumed with `resume` (the printed command's overrides), and the same run never interrupted."""
    topo = runtime.init("gloo")
    with contextlib.redirect_stdout(io.StringIO()) as said:
        resumed = train(compose_once(resume), topo)
    whole = train(compose_once(overrides + [f"out_dir={out}", "name=whole"]), topo)
    return (said.getvalue(), resumed["model_state"], whole["model_state"]) if topo.is_main else None


@pytest.mark.launches
def test_ctrl_c_under_torchrun_checkpoints_and_the_printed_command_resumes_it(run_dist, tmp_path):
    """Ctrl-C as a terminal sends it (SIGINT to the launcher's process group; torch's workers have sessions of
    their own, so torchrun forwards it): every rank finishes its step, checkpoints, the job exits 75 and prints
    the command that continues it; that command's overrides resume (at world 2) to the weights of a run never
    interrupted, bitwise."""
    args = ["experiment=gpt_tiny", "trainer.steps=30", "trainer.log_interval=1", "trainer.eval_interval=0",
            "trainer.ckpt_interval=1000", "data.max_bytes=200000"]
    env = ENV | {"STEP_SLEEP_S": "0.03"}  # tests/recipes/slow_train.py: 30 steps take 1 s or more
    launcher = [sys.executable, "-m", "minidist.recipes.torchrun", "--standalone", "--nproc_per_node=2", "-m",
                "tests.recipes.slow_train"]
    metrics = tmp_path / "cc" / "metrics.jsonl"
    with open(tmp_path / "out", "w") as fo, open(tmp_path / "err", "w") as fe:
        proc = subprocess.Popen([*launcher, *args, f"out_dir={tmp_path}", "name=cc"], cwd=REPO, env=env, stdout=fo,
                                stderr=fe, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not metrics.exists() or not metrics.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "err").read_text()
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 75, (tmp_path / "err").read_text()
    finally:
        proc.kill()
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    said = re.search(r"interrupted \(SIGINT\) after step (\d+), checkpoint saved in (\S+); continue with:\n  (.+)\n",
                     out)
    assert said and 0 < int(said[1]) < 30 and Path(said[2]).is_dir(), out + err
    command = shlex.split(said[3])
    assert command[1:] == launcher[1:] + args + [f"out_dir={tmp_path}", "name=cc", "resume=auto"], command
    assert "SIGINT: stopping after this step" in err and not _noise(err), err
    log, resumed, whole = run_dist(2, _resume_and_uninterrupted, str(tmp_path), command[len(launcher):], args,
                                   timeout=240)[0]
    assert f"resumed from step {said[1]} ({said[2]})" in log, log
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)

"""The recipe as users launch it: torchrun with a crash and a restart, two rendezvous agents
(multi-node on one machine), and one plain process whose error is a single line. Each
subprocess has a timeout; models are tiny."""

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

import torch

from minidist import runtime
from minidist.cli import compose_config
from minidist.train import train
from minidist.train.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]
TINY = ["experiment=gpt_tiny", "trainer.steps=12", "trainer.log_interval=2", "data.max_bytes=200000"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHON=sys.executable, PYTHONWARNINGS="default")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _noise(stderr: str) -> list[str]:
    """Lines that would be a warning or a traceback in normal use."""
    return [ln for ln in stderr.splitlines()
            if "Warning" in ln or "Traceback" in ln or ln.startswith("wandb:")]


def test_crashed_worker_restarts_from_checkpoint_and_finishes(tmp_path):
    # Exactly one restart allowed: the restarted attempt must rendezvous on its first try
    # (minidist.runtime prefixes the store keys per attempt; see _restart_safe_store).
    env = ENV | {"NPROC": "2", "MAX_RESTARTS": "1", "RUN": "crash", "CKPT_INTERVAL": "4",
                 "ENTRY": "tests.recipes.crashing_train", "CRASH_AT_STEP": "7"}
    p = subprocess.run(["bash", str(REPO / "launch/local.sh"), *TINY, f"out_dir={tmp_path}", "logger.mode=offline"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    run = tmp_path / "crash"
    assert "Connection refused" not in p.stderr, p.stderr
    assert p.returncode == 0, p.stdout + p.stderr
    assert (run / "crash_injected").exists()
    assert "injected crash before step 7" in p.stderr and "resumed from step 4" in p.stdout, p.stdout + p.stderr
    rows = read_metrics(run / "metrics.jsonl")
    assert rows[-1]["step"] == 12 and "final/loss" in rows[-1]
    assert {r["step"] for r in rows if "train/loss" in r} >= {2, 4, 6, 8, 10, 12}
    assert any("comm/all_reduce_bytes" in r for r in rows)  # the traced step's collectives
    assert (run / "curves.png").stat().st_size > 0 and (run / ".hydra" / "config.yaml").exists()
    assert list((run / "wandb").glob("offline-run-*")), "wandb (offline) writes inside the run dir"
    assert not _noise(p.stderr.replace("injected crash", "")), _noise(p.stderr)


def test_two_agents_rendezvous_as_two_nodes(tmp_path):
    env = ENV | {"NNODES": "2", "NPROC": "1", "MASTER": f"127.0.0.1:{_free_port()}", "RUN": "twonode"}
    cmd = ["bash", str(REPO / "launch/multinode.sh"), *TINY, f"out_dir={tmp_path}"]
    # Output goes to files, not pipes: c10d hands rank 0 (the chatty one) to either agent, and a
    # pipe nobody reads while we wait on the other agent fills up and blocks it mid-run.
    logs = [(tmp_path / f"agent{n}.out", tmp_path / f"agent{n}.err") for n in range(2)]
    procs = []
    for n, (out, err) in enumerate(logs):
        with open(out, "w") as fo, open(err, "w") as fe:
            procs.append(subprocess.Popen(cmd, cwd=REPO, env=env | {"NODE_RANK": str(n)}, stdout=fo, stderr=fe))
    try:
        for proc in procs:
            proc.wait(timeout=240)
    finally:
        for proc in procs:
            proc.kill()
    outs = [(out.read_text(), err.read_text()) for out, err in logs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    rows = read_metrics(tmp_path / "twonode" / "metrics.jsonl")
    assert rows[-1]["step"] == 12 and rows[-1]["final/loss"] < rows[0]["train/loss"]
    assert "final" in outs[0][0] + outs[1][0]


def test_plain_process_error_is_one_line(tmp_path):
    p = subprocess.run([sys.executable, "-m", "recipes.train", "model=resnet18", "strategy=single", "data=cifar10", f"data.root={tmp_path}", "data.download=false", f"out_dir={tmp_path}"],
                       cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "data.root" in lines[0] and "data.download" in lines[0], p.stderr


def test_sigterm_checkpoints_and_exits_for_requeue(tmp_path):
    import signal
    import time
    cmd = [sys.executable, "-m", "recipes.train", "experiment=gpt_tiny", "strategy=single", "trainer.steps=100000",
           "trainer.log_interval=1", "data.max_bytes=200000", f"out_dir={tmp_path}", "name=pre", "logger.mode=disabled"]
    with open(tmp_path / "out", "w") as fo, open(tmp_path / "err", "w") as fe:
        proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, stdout=fo, stderr=fe)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "pre" / "metrics.jsonl").exists() or not (tmp_path / "pre" / "metrics.jsonl").read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "the run never logged a step"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # what SLURM or a cloud scheduler sends before the kill
        assert proc.wait(timeout=60) == 75  # EXIT_PREEMPTED: requeue me
    finally:
        proc.kill()
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    step = int((tmp_path / "pre" / "PREEMPTED").read_text())
    assert f"preempted (SIGTERM) after step {step}, checkpoint saved" in out, out + err
    assert (tmp_path / "pre" / "checkpoints" / f"step_{step:07d}" / "COMPLETE").exists()
    assert not _noise(err), err


def test_slurm_script_requeues_a_preempted_torchrun_job(tmp_path):
    """launch/slurm.sbatch as SLURM runs it, with srun and scontrol stood in for: the time-limit SIGTERM
    reaches the script, torchrun forwards it, the workers checkpoint and exit 75, torchrun (through
    minidist.recipes.torchrun) exits 75 without a traceback, and the script requeues the job."""
    import signal
    import time
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (fake / "scontrol").write_text('#!/bin/bash\n[ "$1" = show ] && { echo localhost; exit 0; }\n'
                                   'echo "$@" >> "$SCONTROL_LOG"\n')
    for f in fake.iterdir():
        f.chmod(0o755)
    env = ENV | {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO), "NPROC": "2",
                 "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "RUN": "pre",
                 "SLURM_SUBMIT_DIR": str(tmp_path), "PORT": str(_free_port()), "SCONTROL_LOG": str(tmp_path / "sc")}
    cmd = ["bash", str(REPO / "launch/slurm.sbatch"), "experiment=gpt_tiny", "trainer.steps=100000",
           "trainer.log_interval=1", "data.max_bytes=200000", f"out_dir={tmp_path}", "logger.mode=disabled"]
    run = tmp_path / "pre"
    with open(tmp_path / "out", "w") as fo, open(tmp_path / "err", "w") as fe:
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=fo, stderr=fe)
    try:
        deadline = time.monotonic() + 180
        while not (run / "metrics.jsonl").exists() or not (run / "metrics.jsonl").read_text():
            assert time.monotonic() < deadline and proc.poll() is None, (tmp_path / "err").read_text()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)  # --signal=B:TERM@120: SLURM signals the batch shell
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    out, err = (tmp_path / "out").read_text(), (tmp_path / "err").read_text()
    assert "preempted (checkpoint saved); requeueing job 4242" in out, out + err
    assert (tmp_path / "sc").read_text().split() == ["requeue", "4242"]
    step = int((run / "PREEMPTED").read_text())
    assert (run / "checkpoints" / f"step_{step:07d}" / "COMPLETE").exists()
    assert not _noise(err), err


def _resume_and_uninterrupted(out: str, resume: list[str], overrides: list[str]) -> tuple | None:
    """The run resumed with `resume` (the printed command's overrides), and the same run never interrupted."""
    topo = runtime.init("gloo")
    with contextlib.redirect_stdout(io.StringIO()) as said:
        resumed = train(compose_config(resume), topo)
    whole = train(compose_config(overrides + [f"out_dir={out}", "name=whole"]), topo)
    return (said.getvalue(), resumed["model_state"], whole["model_state"]) if topo.is_main else None


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

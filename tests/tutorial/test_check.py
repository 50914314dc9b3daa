"""`python -m minidist.tutorial.check`: every rung's checks pass on its solution and fail on its stub,
a wrong implementation fails the check that names its mistake, and the command answers in one line
per check with its exit status (one real spawned world; the rest on the shared worker pool)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minidist.tutorial.check import __main__ as cli
from minidist.tutorial.check.rungs import RUNGS

ROOT = Path(__file__).resolve().parents[2]


def _every_rung() -> dict:
    from minidist.tutorial.check.rungs import run_checks
    return {(name, kind): run_checks(name, str(path)) for name, rung in RUNGS.items()
            for kind, path in (("solution", rung.solution_path), ("stub", rung.stub))}


def test_every_solution_passes_and_every_stub_fails(run_dist):
    results = run_dist(2, _every_rung, timeout=240)
    for rank_results in results:
        for (name, kind), verdicts in rank_results.items():
            assert [c for c, _, _ in verdicts] == [c.name for c in RUNGS[name].checks], (name, kind)
            if kind == "solution":
                assert all(ok for _, ok, _ in verdicts), (name, [v for v in verdicts if not v[1]])
            else:
                assert not any(ok for _, ok, _ in verdicts), (name, verdicts)
                assert all("NotImplementedError" in detail for _, _, detail in verdicts), (name, verdicts)


FLAT_WITHOUT_MEAN = '''
import torch, torch.nn as nn
from minidist import comm
from minidist.tutorial.ddp_naive import broadcast_from_rank0
class FlatDDP(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        broadcast_from_rank0(module)
    def forward(self, *a):
        return self.module(*a)
    @torch.no_grad()
    def finish_gradient_synchronization(self):
        for p in self.module.parameters():       # one call per tensor, and the sum, not the mean
            comm.all_reduce(p.grad)
'''


def _mistakes(path: str) -> list:
    from minidist.tutorial.check.rungs import run_checks
    return run_checks("ddp_flat", path)


def test_a_wrong_implementation_fails_the_checks_that_name_its_mistakes(run_dist, tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text(FLAT_WITHOUT_MEAN)
    verdicts = {name: (ok, detail) for name, ok, detail in run_dist(2, _mistakes, str(mine))[0]}
    assert verdicts["starts from rank 0's values"][0] and verdicts["bytes per step"][0], verdicts
    assert not verdicts["equal to one process"][0], verdicts        # the sum is N times the mean
    assert not verdicts["all_reduces per step"][0] and "(torch's profiler; want 1)" in \
        verdicts["all_reduces per step"][1], verdicts


def _gpipe_as_1f1b(path: str) -> list:
    from minidist.tutorial.check.rungs import run_checks
    return run_checks("pp", path)


def test_a_1f1b_that_runs_gpipes_order_fails_only_the_memory_check(run_dist, tmp_path):
    """Both orders train alike and send alike: only the activations held tell 1F1B from GPipe."""
    mine = tmp_path / "mine.py"
    source = (ROOT / "minidist/tutorial/pp.py").read_text()
    mine.write_text(source.replace('    if schedule != "1f1b":', '    if schedule in ("1f1b", "gpipe"):  # wrong'
                                   '\n        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]'
                                   '\n    if schedule != "1f1b":'))
    verdicts = {name: (ok, detail) for name, ok, detail in run_dist(2, _gpipe_as_1f1b, str(mine))[0]}
    assert [n for n, (ok, _) in verdicts.items() if not ok] == ["activations held"], verdicts
    assert "1F1B at most" in verdicts["activations held"][1], verdicts


@pytest.mark.launches
def test_the_command_passes_a_solution_in_its_own_world():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "minidist.tutorial.check", "tp", "minidist/tutorial/tp.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stdout + out.stderr
    assert [s.split(":")[0] for s in lines[1:-1]] == [f"PASS  {c.name}" for c in RUNGS["tp"].checks], lines
    assert lines[-1] == f"{len(RUNGS['tp'].checks)} of {len(RUNGS['tp'].checks)} checks pass", lines
    assert out.stderr == "", out.stderr


def test_the_command_reports_each_failed_check_and_exits_1(monkeypatch, capsys):
    checks = RUNGS["zero1"].checks
    verdicts = [(c.name, i != 1, f"detail {i}") for i, c in enumerate(checks)]
    monkeypatch.setattr("minidist.tutorial.check.world.run_world", lambda *a, **k: [("ok", verdicts)] * 2)
    assert cli.check("zero1", "mine.py", 2, 10) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == f"FAIL  {checks[1].name}: detail 1" and lines[-1] == f"{len(checks) - 1} of {len(checks)} checks pass"
    monkeypatch.setattr("minidist.tutorial.check.world.run_world",
                        lambda *a, **k: [("ok", verdicts), ("missing", "rank 1 did not finish within 10 s")])
    assert cli.check("zero1", "mine.py", 2, 10) == 1
    assert "FAIL  rank 1: rank 1 did not finish within 10 s" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [(["nope", "x.py"], "rung 'nope' is not one of"),
                                         (["ddp_naive", "missing.py"], "'missing.py' is not a file"),
                                         (["ddp_naive", "README.md"], "README.md does not import"),
                                         (["zero1", "minidist/tutorial/ddp_naive.py"], "defines no ShardedOptimizer")])
def test_a_bad_command_line_is_one_line_and_exit_64(argv, says, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 64 and says in err and len(err.strip().splitlines()) == 1, err

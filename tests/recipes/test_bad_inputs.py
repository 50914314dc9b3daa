"""Bad inputs, as a new user types them: one line naming the key and what is valid, exit 64 (runtime.EXIT_USAGE),
printed once at world 1 and under torchrun, the run's files untouched; a sweep's every job checked before
the first runs. Composition is checked in process; three subprocesses check what a user sees."""

import os
import sys
from pathlib import Path

import pytest

from minidist.recipes import hydra_cli
from minidist.recipes.compare import compose as compose_compare
from minidist.recipes.compare import main as compare_main
from minidist.recipes.train import _check_jobs
from minidist.runtime import EXIT_USAGE
from minidist.cli.compose import ConfigError, compose_config
from minidist.train.run_dir import Action, decide
from tests.harness import run_command

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="default")
TINY = ["experiment=gpt_tiny", "trainer.steps=4", "trainer.log_interval=2", "data.max_bytes=100000"]


def _jobs(*argv: str, world=(2, 2)):
    return _check_jobs(hydra_cli.parse(list(argv))[0], world)


@pytest.mark.parametrize("argv,expect", [
    (["experiment=gpt_tiny", "~data"], ["no data config (removed with ~data?)", "stdlib, cifar10, synthetic"]),
    (["~trainer.steps"], ["trainer.steps cannot be removed", "trainer.steps=<value>"]),
    (["strategy=hybrid_shard", "strategy.shard_size=3"], ["strategy.shard_size=3 does not divide the 2 ranks",
                                                          "valid sizes: 1, 2"]),
    (["strategy=single"], ["strategy=single runs one process, but this job has 2", "strategy=ddp"]),
    (["experiment=gpt_tiny", "model.n_head=3"], ["model.n_head=3 must divide model.n_embd=32", "1, 2, 4, 8, 16, 32"]),
    (["model.n_layer=0"], ["model.n_layer=0 must be >= 1"]),
    # every job of a sweep is composed and its model checked before the first job starts
    (["-m", "experiment=gpt_tiny", "model.n_head=2,3"], ["model.n_head=3 must divide model.n_embd=32"]),
    (["-m", "strategy=hybrid_shard", "strategy.shard_size=1,4"], ["strategy.shard_size=4 does not divide"]),
])
def test_train_mistakes_are_one_line(argv, expect):
    with pytest.raises(ConfigError) as info:
        _jobs(*argv)
    msg = str(info.value)
    assert "\n" not in msg and all(e in msg for e in expect), msg


def test_world_dependent_rules_follow_the_world():
    _jobs("strategy=hybrid_shard", "strategy.shard_size=2", world=(4, 2))  # a 2 x 2 mesh: fine
    with pytest.raises(ConfigError, match=r"=null means the processes per node \(3\).*one of 1, 2, 4"):
        _jobs("strategy=hybrid_shard", world=(4, 3))
    _jobs("strategy=hybrid_shard", "strategy.shard_size=3", world=(None, None))  # unknown (elastic): not checked
    # `--cfg job` prints the config for any world; the same command line fails once it would run
    assert hydra_cli.is_informational(hydra_cli.parse(["--cfg", "job"])[0])


def test_resume_auto_of_a_run_that_never_ran_says_so(tmp_path):
    cfg = compose_config(TINY + [f"out_dir={tmp_path}", "name=never", "resume=auto"])
    plan = decide(cfg)
    assert plan.action is Action.NEW and plan.message == f"resume=auto: no checkpoint in {tmp_path.resolve()}/never: " \
                                                         f"starting from step 0 (a new run)", plan.message


def test_compare_mistakes_are_one_line():
    for argv, estimate, expect in [
        (["strategy_options.hybrid_shard.shard_size=3"], True,
         "strategy_options.hybrid_shard.shard_size=3 does not divide estimate.worlds entry 4: "
         "hybrid_shard needs a (world / shard) x shard mesh; valid sizes: 1, 2, 4, 8, 16, 32, 64"),
        (["strategy_options.hybrid_shard.shard_size=3", "estimate.worlds=[2,4]"], True, "valid sizes: 1, 2, 4"),
        (["strategy_options.hybrid_shard.shard_size=4"], False, "does not divide the 2 ranks of this job"),
        (["strategies=[ddp,zero9]"], False, "zero9 not valid"),
        (["model=resnet18", "data=stdlib"], False, "model=resnet18 reads images, not data=stdlib's text: use "
                                                   "data=synthetic (generated, the default with this model) or "
                                                   "data=cifar10"),
        (["model=resnet18", "strategies=[ddp+tp2]"], False, "tensor parallelism has a plan for model=gpt only"),
        (["plan.precision=fp8"], True, "plan.precision='fp8': choose fp32, bf16 or fp16"),
        (["plan.cluster=dgx"], True, "plan.cluster='dgx': choose one of h100_ib_8x400g, gpu_eth_2x100g"),
    ]:
        with pytest.raises(ConfigError) as info:
            compose_compare(argv, world=(2, 2), estimate=estimate)
        assert "\n" not in str(info.value) and expect in str(info.value), str(info.value)
    # a shard group larger than a tabulated world is that whole world, as the estimate computes it
    compose_compare(["strategy_options.hybrid_shard.shard_size=8", "estimate.worlds=[1,2,16]"], estimate=True)
    # model=resnet18 runs as typed: images it reads without a download, the rows without tensor parallelism
    resnet = compose_compare(["model=resnet18"], world=(2, 2))
    assert resnet.data.source == "synthetic" and "ddp" in resnet.strategies
    assert not [row for row in resnet.strategies if "+tp" in row]
    assert compose_compare(["model=resnet18", "data=cifar10"], world=(2, 2)).data.source == "cifar10"


def test_compare_takes_hydras_flags(capsys):
    compare_main(["--help"])
    out = capsys.readouterr().out
    assert "minidist-compare" in out and "--estimate" in out and "strategy_options.ddp.bucket_cap_mb" in out
    compare_main(["--cfg", "job", "steps=3"])
    from omegaconf import OmegaConf
    assert OmegaConf.create(capsys.readouterr().out).steps == 3


def _run(cmd, env=ENV):
    return run_command(cmd, timeout=240, cwd=REPO, env=env)


@pytest.mark.launches
def test_world_one_is_one_line_and_exit_64(tmp_path):
    p = _run([sys.executable, "-m", "recipes.train", "experiment=gpt_tiny", "~data", f"out_dir={tmp_path}"])
    assert p.returncode == EXIT_USAGE and p.stderr.splitlines() == [
        "error: ConfigError: no data config (removed with ~data?): every run needs one of stdlib, cifar10, "
        "synthetic (data=<choice>)"], p.stderr
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.launches
def test_launcher_checks_before_any_worker_starts(tmp_path):
    """minidist.recipes.torchrun (make train, launch/*.sh), here as launch/local.sh starts it (NPROC=2
    processes, the run directory under OUT): the line, exit 64, no torchrun traceback."""
    p = _run(["bash", str(REPO / "launch/local.sh"), "strategy=hybrid_shard", "strategy.shard_size=3"],
             env=ENV | {"NPROC": "2", "OUT": str(tmp_path), "RUN": "bad", "PYTHON": sys.executable})
    assert p.returncode == EXIT_USAGE, p.stderr
    assert p.stderr.splitlines() == ["error: ConfigError: strategy.shard_size=3 does not divide the 2 ranks of this "
                                     "job: hybrid_shard needs a (world / shard) x shard mesh; valid sizes: 1, 2; "
                                     "null = the processes per node (2)"], p.stderr
    assert not list(tmp_path.iterdir())  # no run directory


@pytest.mark.launches
def test_refusal_under_torchrun_is_printed_once_and_leaves_the_run_alone(tmp_path):
    """A run directory that holds a run, reused without resume=: every rank refuses after the process
    group exists, local rank 0 says it once, and the old run's files are byte for byte the same. Through
    minidist.recipes.torchrun (make train) that line is all: none of torchrun's own about the workers it
    ends ("Sending process ... closing signal", "failed (exitcode: 64)"), and the job exits 64 (bare
    torchrun would add its failure report and exit 1)."""
    run = tmp_path / "taken"
    (run / ".hydra").mkdir(parents=True)
    files = {run / "metrics.jsonl": '{"step": 1, "train/loss": 5.0}\n', run / ".hydra" / "config.yaml": "x: 1\n"}
    for f, text in files.items():
        f.write_text(text)
    p = _run([sys.executable, "-m", "minidist.recipes.torchrun", "--standalone", "--nproc_per_node=2", "-m",
              "recipes.train", *TINY, f"out_dir={tmp_path}", "name=taken"])
    assert p.returncode == EXIT_USAGE and p.stderr.splitlines() == [
        f"error: UsageError: {run.resolve()} already holds a run; resume=auto continues it, or choose another "
        f"name= (or hydra.run.dir=) for a new run"], p.stderr
    assert {f: f.read_text() for f in files} == files and sorted(p.name for p in run.iterdir()) == [
        ".hydra", "metrics.jsonl"]

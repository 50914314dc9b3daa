"""The training recipe: Hydra configs in, a trained model, metrics and checkpoints out.

    torchrun --standalone --nproc_per_node=2 -m recipes.train                 # the main job (ddp)
    torchrun --standalone --nproc_per_node=2 -m recipes.train strategy=full_shard model.n_layer=6
    python -m recipes.train strategy=single                                   # one process, no torchrun
    python -m recipes.train --cfg                                             # print the composed config

Arguments are Hydra overrides of configs/config.yaml (groups: strategy, model,
data, optim, trainer, logger, experiment). The config is composed with Hydra's
compose API, so Hydra itself writes nothing and changes no directory: every
file of the run is written by rank 0 under <out_dir>/<name>/.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None, callbacks=()) -> None:
    """Compose the config, train on every rank, exit; callbacks go to train() (tests inject faults so)."""
    args = sys.argv[1:] if argv is None else argv
    from minidist import runtime
    from minidist.train.compose import ConfigError, compose_config, to_yaml

    print_only = "--cfg" in args
    try:
        cfg = compose_config([a for a in args if a != "--cfg"])
    except ConfigError as exc:
        runtime.exit_on_error(exc)
    if print_only:
        print(to_yaml(cfg), end="")
        return
    from minidist.train.preemption import EXIT_PREEMPTED
    from minidist.train.trainer import train

    try:
        with runtime.distributed(cfg.backend.value, cfg.timeout_s) as topo:
            result = train(cfg, topo, callbacks)
        if result.get("preempted"):
            runtime.exit_process(EXIT_PREEMPTED)
    except KeyboardInterrupt:
        runtime.exit_on_error(KeyboardInterrupt("interrupted"))
    except Exception as exc:  # noqa: BLE001 - one line per rank; MINIDIST_TRACEBACK=1 for the trace
        runtime.exit_on_error(exc)
    runtime.exit_process(0)  # the process group is gone; skip a teardown that can abort (see there)


if __name__ == "__main__":
    main()

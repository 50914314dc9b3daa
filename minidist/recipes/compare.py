"""Compare strategies side by side: the same model and data under each, measured next to the formulas.

    torchrun --standalone --nproc_per_node=2 -m recipes.compare
    torchrun --standalone --nproc_per_node=2 -m recipes.compare model=gpt strategies=[ddp,zero1,shard_grad_op,full_shard,hybrid_shard]
    python -m recipes.compare --estimate model.n_layer=12 estimate.worlds=[1,8,64]   # memory only, nothing runs
    python -m recipes.compare --cfg                                                  # print the composed config
    minidist-compare --estimate                                                      # installed: from anywhere

Arguments are Hydra overrides of configs/compare.yaml (minidist.compare.config); the work is
minidist.compare.run. Outputs: <out_dir>/<name> (default outputs/compare-<timestamp>).
"""

from __future__ import annotations

import sys


def compose(args: list[str]):
    """configs/compare.yaml with overrides, on its schemas; raises ConfigError / ValueError (one line)."""
    from hydra.core.config_store import ConfigStore

    from minidist.compare.config import CompareConfig, check
    from minidist.train.compose import compose_config

    ConfigStore.instance().store(name="compare_schema", node=CompareConfig)
    cfg = compose_config(args, config_name="compare")
    check(cfg)
    return cfg


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    from minidist import runtime

    flags = {"--cfg", "--estimate"} & set(args)
    try:
        cfg = compose([a for a in args if a not in flags])
    except ValueError as exc:  # ConfigError is a ValueError
        runtime.exit_on_error(exc)
    if "--cfg" in flags:
        from omegaconf import OmegaConf
        print(OmegaConf.to_yaml(cfg), end="")
        return
    from minidist.compare import run

    if "--estimate" in flags:
        print(run.estimate_table(cfg))
        return
    try:
        with runtime.distributed(cfg.backend.value, cfg.timeout_s) as topo:
            run.compare(cfg, topo)
    except KeyboardInterrupt:
        runtime.exit_on_error(KeyboardInterrupt("interrupted"))
    except Exception as exc:  # noqa: BLE001 - one line per rank; MINIDIST_TRACEBACK=1 for the trace
        runtime.exit_on_error(exc)
    runtime.exit_process(0)


if __name__ == "__main__":
    main()

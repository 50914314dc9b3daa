"""Composing a run's configuration: Hydra's compose API over configs/, checked by the schemas.

    cfg = compose_config(["strategy=full_shard", "model.n_layer=6"])

Every schema in minidist.cli.config is registered in Hydra's ConfigStore and
each preset yaml names its schema in its defaults list, so OmegaConf rejects an
unknown key or a wrong type; this module turns that rejection into one line
naming the key and what is valid (ConfigError). Keys added with `+` bypass
OmegaConf's check, so the composed tree is checked against the schemas again.
The command line (minidist.recipes.train) composes every job here first, so a
mistake is one line before any process group or file exists.
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from minidist import strategies
from minidist.cli.config import CONFIG_DIR, RunConfig, groups
from minidist.cp.plan import check_degree as check_cp_degree
from minidist.parallel import pipeline
from minidist.parallel.parallelize import check_context_parallel, check_tensor_parallel, cp_policy, layout_dims
from minidist.runtime import UsageError, launched_world
from minidist.tp.plan import check_degree
from minidist.train.metrics import WANDB_MODES
from minidist.train.preemption import signal_number


def register_schemas() -> None:
    """Put every schema in Hydra's ConfigStore under schema/<group>/<name> (idempotent), with the
    resolvers configs/config.yaml uses. A registered strategy without a preset file
    (configs/strategy/<name>.yaml) gets its preset there too: strategy=<name> composes its schema's
    defaults. minidist's Hydra launcher and sweeper (hydra/launcher=minidist) register themselves:
    Hydra imports every module of the hydra_plugins namespace when it starts.

    Storing converts each schema dataclass to an OmegaConf node: ~23 ms, a fifth of a compose (~100 ms
    of CPU), which a process composing many runs (a sweep, the test suite's workers) paid every time. So
    it is done once per set of registered strategy records (a strategy registered later stores again)."""
    _register_schemas(tuple((record.name, record.schema) for record in strategies.records()))


@lru_cache(maxsize=1)
def _register_schemas(records: tuple[tuple[str, type], ...]) -> None:
    """register_schemas for this set of strategy records, (name, schema) each (the argument is the cache key)."""
    from minidist.cli import help as app_help
    from minidist.train.run_dir import hydra_dir

    cs = ConfigStore.instance()
    cs.store(name="schema_root", node=RunConfig)
    for group, options in groups().items():
        for name, node in options.items():
            cs.store(group=f"schema/{group}", name=name, node=node)
    for record in strategies.records():
        if not (CONFIG_DIR / "strategy" / f"{record.name}.yaml").is_file():
            cs.store(group="strategy", name=record.name, node=record.schema(name=record.name))
    OmegaConf.register_new_resolver("minidist.dir", hydra_dir, replace=True)
    app_help.register_resolvers()


class ConfigError(UsageError):
    """A configuration that does not compose; the message is one line (a UsageError: printed once, exit 64)."""



def _schemas() -> dict[str, type]:
    return {cls.__name__: cls for opts in groups().values() for cls in opts.values()} | {"RunConfig": RunConfig}


def _one_line(exc: BaseException) -> str:
    """Hydra/OmegaConf's error, as one line naming the key and the valid choices."""
    from hydra.errors import MissingConfigException

    cause = exc
    while getattr(cause, "full_key", None) is None and (cause.__cause__ or cause.__context__) is not None:
        cause = cause.__cause__ or cause.__context__  # the OmegaConf error that names the key
    key = getattr(cause, "full_key", None)
    obj = getattr(cause, "object_type", None)
    if str(exc).startswith("Multiple values for "):  # `+group=choice` for a group the defaults list has
        group = str(exc).split()[3].rstrip(".")
        return f"{group} is in the defaults list already: choose with {group}=<choice> (no '+')"
    if isinstance(exc, MissingConfigException) or "Could not find" in str(exc):
        text = str(exc)
        head = text.splitlines()[0]
        opts = [ln.strip() for ln in text.split("Available options", 1)[-1].splitlines()[1:]
                if ln.startswith("\t") and "provider=" not in ln and ln.strip()]
        return f"{head.split(': ', 1)[-1]}; valid choices: {', '.join(opts)}" if opts else head
    if key and "does not support deletion" in str(cause):  # ~trainer.steps: a schema field cannot go
        return f"{key} cannot be removed (~{key}): every field of its schema is required; set it instead " \
               f"({key}=<value>; `--help` shows each option and its default)"
    if key and obj is not None and type(cause).__name__ in ("ConfigAttributeError", "ConfigKeyError"):
        schema = _schemas().get(getattr(obj, "__name__", ""), obj)
        valid = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else []
        return f"unknown key '{key}'; valid keys here: {', '.join(valid)}"
    if key:
        msg = str(cause).splitlines()[0]
        return f"bad value for '{key}': {msg}"
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip() and "provider=" not in line)


def compose_config(overrides: list[str] | tuple[str, ...] = (), config_name: str = "config",
                   config_dir: str | None = None, world: tuple[int | None, int | None] | None = None) -> DictConfig:
    """Compose configs/<config_name>.yaml (also searched in config_dir: the command line's --config-name /
    --config-dir) with command-line style overrides; raise ConfigError (one line).

    A training config (root schema RunConfig) is checked by check() below, at `world` = (world size,
    processes per node) (default: torchrun's environment, or a world of one; None in either: unknown,
    not checked); other primary configs (compare) register their root schema first and check their own rules.
    """
    from hydra import compose, initialize_config_dir

    register_schemas()
    overrides = list(overrides)
    if config_dir is not None:
        if not Path(config_dir).is_dir():
            raise ConfigError(f"--config-dir {config_dir}: no such directory")
        overrides.append(f"hydra.searchpath=[file://{Path(config_dir).resolve()}]")
    try:
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3", job_name="train"):
            cfg = compose(config_name=config_name, overrides=overrides)
    except Exception as exc:  # noqa: BLE001 - Hydra raises many kinds; all become one line
        raise ConfigError(_one_line(exc)) from exc
    if OmegaConf.get_type(cfg) is RunConfig:
        check(cfg, *(launched_world() if world is None else world))
    return cfg


def check_known_keys(node, path: str = "") -> None:
    """Every key of a schema-typed node is a field of its schema (`+key=value` adds keys past OmegaConf)."""
    schema = OmegaConf.get_type(node)
    if dataclasses.is_dataclass(schema):
        fields = [f.name for f in dataclasses.fields(schema)]
        for key in node.keys():
            if key not in fields:
                raise ConfigError(f"unknown key '{path}{key}'; valid keys here: {', '.join(fields)}")
    for key in node.keys():
        if not OmegaConf.is_missing(node, key) and isinstance(node[key], DictConfig):
            check_known_keys(node[key], f"{path}{key}.")


def check(cfg: DictConfig, world_size: int | None = None, local_world_size: int | None = None) -> None:
    """Cross-group rules the schemas cannot express. world_size / local_world_size: the job's ranks and
    processes per node, when known (the rules that depend on them are skipped otherwise)."""
    for group, options in groups().items():
        if OmegaConf.is_missing(cfg, group) or OmegaConf.get_type(cfg[group]) not in options.values():
            # ~data removes the group; an experiment's data.* keys then make an untyped node in its place
            raise ConfigError(f"no {group} config (removed with ~{group}?): every run needs one of "
                              f"{', '.join(options)} ({group}=<choice>)")
    check_known_keys(cfg)
    wandb_mode = os.environ.get("WANDB_MODE")
    if cfg.logger.mode is None and wandb_mode is not None and wandb_mode not in WANDB_MODES:
        raise ConfigError(f"WANDB_MODE={wandb_mode!r} is not a wandb mode; use one of {', '.join(WANDB_MODES)}")
    model, data = cfg.model.name, cfg.data.source
    if model == "gpt" and data == "cifar10":
        raise ConfigError("model=gpt needs token data: use data=stdlib or data=synthetic")
    if model == "resnet18" and data == "stdlib":
        raise ConfigError("model=resnet18 needs images: use data=cifar10 or data=synthetic")
    if cfg.resume not in ("never", "auto") and not Path(cfg.resume).is_dir():
        raise ConfigError(f"resume={cfg.resume!r}: not 'never', 'auto' or an existing checkpoint directory")
    _check_trainer(cfg.trainer)
    check_model(cfg.model)
    _check_degrees(cfg)
    _check_pp(cfg)
    _check_strategy(cfg.strategy, world_size, local_world_size)


def _check_trainer(tc) -> None:
    for key in ("steps", "batch_size", "grad_accum", "log_interval", "keep_last"):
        if tc[key] < 1:
            raise ConfigError(f"trainer.{key}={tc[key]} must be >= 1")
    for key in ("eval_interval", "ckpt_interval", "eval_stride"):
        if tc[key] < 0:
            raise ConfigError(f"trainer.{key}={tc[key]} must be >= 0 (0 turns it off)")
    for name in tc.preempt_signals:
        try:
            signal_number(name)
        except ValueError as exc:
            raise ConfigError(f"trainer.preempt_signals: {exc}") from None


def _check_strategy(st, world_size: int | None, local_world_size: int | None) -> None:
    if st.get("shard_size") is not None and st.shard_size < 1:
        raise ConfigError(f"strategy.shard_size={st.shard_size} must be >= 1 (ranks per shard group), "
                          f"or null for the processes per node")
    if st.get("bucket_cap_mb") is not None and st.bucket_cap_mb <= 0:
        raise ConfigError(f"strategy.bucket_cap_mb={st.bucket_cap_mb} must be > 0, or null for torch's "
                          f"default (25 MiB after a 1 MiB first bucket)")
    if st.get("prefetch") is not None and st.prefetch < 0:
        raise ConfigError(f"strategy.prefetch={st.prefetch} must be >= 0 (units gathered ahead; 0 = none)")
    if world_size is None:
        return
    try:  # the strategy's own rules at this world (hybrid_shard's group; null explained), then its mesh's
        strategies.get(st.name).check(st, "strategy", [world_size], local_world_size)
        layout_dims(st, world_size, local_world_size)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check_model(model_cfg) -> None:
    """The model can be built: its own constructor's rules (checked on the meta device, no memory), the
    GPT's head count named with the keys. Every job of a sweep is checked so before the first starts."""
    import torch

    from minidist.train.task import make_task

    if model_cfg.name == "gpt":
        for key in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if model_cfg[key] < 1:
                raise ConfigError(f"model.{key}={model_cfg[key]} must be >= 1")
        if not 0 <= model_cfg.dropout < 1:
            raise ConfigError(f"model.dropout={model_cfg.dropout} must be in [0, 1)")
    if model_cfg.name == "gpt" and model_cfg.n_embd % model_cfg.n_head:
        valid = [h for h in range(1, model_cfg.n_embd + 1) if model_cfg.n_embd % h == 0]
        raise ConfigError(f"model.n_head={model_cfg.n_head} must divide model.n_embd={model_cfg.n_embd}; valid "
                          f"n_head: {', '.join(map(str, valid[:12]))}{', ...' if len(valid) > 12 else ''}")
    try:
        with torch.device("meta"), _uninitialised():
            make_task(model_cfg).build()
    except (ValueError, RuntimeError, AssertionError, TypeError, ZeroDivisionError) as exc:
        raise ConfigError(f"model={model_cfg.name} cannot be built from these model.* values: "
                          f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def _uninitialised():
    """A torch function mode in which in-place initialisers (normal_, uniform_, ...) leave their tensor as it
    is: on the meta device there are no values to set. Why: torch's meta normal_ is a Python decomposition
    that imports torch._dynamo the first time it runs, ~1 s of CPU in every process that checks a model
    (the launcher before any worker starts, each worker, `--cfg job`), for values that do not exist."""
    import torch
    from torch.overrides import TorchFunctionMode

    on_tensors = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.zero_, torch.Tensor.fill_}

    class Uninitialised(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in on_tensors or getattr(func, "__module__", None) == "torch.nn.init":  # nn.init.normal_, ...
                return args[0] if args else kwargs["tensor"]
            return func(*args, **kwargs)

    return Uninitialised()


def _tp_rules(cfg: DictConfig, tp: int) -> None:
    st = cfg.strategy
    check_tensor_parallel(cfg.model.name, tp, f"strategy.tp_size={tp}", "use strategy.tp_size=1")
    check_degree(cfg.model, tp, sequence_parallel=st.sequence_parallel, vocab_parallel=st.vocab_parallel,
                 setting="strategy.tp_size", prefix="model.")


def _cp_rules(cfg: DictConfig, cp: int) -> None:
    check_context_parallel(cfg.model.name, cp, f"strategy.cp_size={cp}", "use strategy.cp_size=1")
    check_cp_degree(cfg.model, cp, cp_policy(cfg.strategy).chunking, setting="strategy.cp_size", prefix="model.")


DEGREES = {"tp_size": ("tensor", _tp_rules), "cp_size": ("context", _cp_rules)}
"""strategy.<key>: (the parallelism it sets, its rules against the model: ValueError naming the key)."""


def _check_degrees(cfg: DictConfig) -> None:
    """Each degree against the model (the world is checked when the layout is built)."""
    for key, (kind, rules) in DEGREES.items():
        n = cfg.strategy.get(key, 1)
        if n < 1:
            raise ConfigError(f"strategy.{key}={n} must be >= 1 (1: no {kind} parallelism)")
        if n > 1:
            try:
                rules(cfg, n)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None


def _check_pp(cfg: DictConfig) -> None:
    """strategy.pp_size, pp_schedule and trainer.microbatches against the model, the batch and each other
    (the world is checked when the layout is built)."""
    try:
        pipeline.check(cfg)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)

"""The grammar of the comparison's rows (`strategies`): a strategy alone, or one dimension composed with it.

    r = Row.parse("full_shard+pp2")      # Row(base="full_shard", pp=2)
    r.degrees                            # {"pp_size": 2}: the trainer's strategy overrides
    so = row_strategy(cfg, "ddp+tp2")    # strategy_options.ddp with tp_size=2

    <strategy>          data parallelism over every rank
    <strategy>+tp<T>    tensor parallelism of degree T inside, the strategy over the N / T others
    <strategy>+cp<C>    context parallelism of degree C, the strategy over all N ranks (dp x cp)
    <strategy>+pp<P>    a pipeline of P stages (trainer.microbatches = cfg.pp_microbatches), the strategy
                        over each stage's N / P data-parallel ranks

Every rule a row must satisfy is checked here, in one line naming `strategies` (check_rows,
check_rows_world), with the trainer's own checks for the dimension it names.
"""

from __future__ import annotations

import re
import types
from dataclasses import dataclass

from omegaconf import OmegaConf

from minidist import strategies
from minidist.cp.plan import check_degree as check_cp_degree
from minidist.parallel.parallelize import check_context_parallel, check_tensor_parallel, cp_policy
from minidist.parallel.pipeline import check as check_pipeline
from minidist.tp.plan import check_degree

ROW = re.compile(r"(?P<base>[a-z0-9_]+)(?:\+(?P<dim>tp|cp|pp)(?P<degree>[0-9]+))?")
"""A row of `strategies`: <strategy>, or one dimension composed with it, <strategy>+tp<T> | +cp<C> | +pp<P>."""


@dataclass(frozen=True)
class Row:
    """A row of `strategies`, parsed: "full_shard+tp2" -> Row("full_shard", tp=2), "ddp+pp2" -> Row("ddp", pp=2);
    a name the grammar does not know is a Row of that base (check() names it)."""

    base: str
    tp: int = 1
    cp: int = 1
    pp: int = 1

    @classmethod
    def parse(cls, row: str) -> "Row":
        m = ROW.fullmatch(row)
        return cls(m["base"], **({m["dim"]: int(m["degree"])} if m["dim"] else {})) if m else cls(row)

    @property
    def degrees(self) -> dict[str, int]:
        """The trainer's strategy overrides of the dimension it names ({tp_size: T} ...); {} for a plain row."""
        return {f"{d}_size": k for d, k in (("tp", self.tp), ("cp", self.cp), ("pp", self.pp)) if k != 1}

    @property
    def size(self) -> int:
        """Ranks the named dimension groups (T, C or P; 1 for a plain row): it must divide the world."""
        return self.tp * self.cp * self.pp

    @property
    def dim(self) -> str | None:
        """"tp", "cp" or "pp", the dimension it names; None for a plain row."""
        return next((d for d, k in (("tp", self.tp), ("cp", self.cp), ("pp", self.pp)) if k != 1), None)


def row_strategy(cfg, row: str):
    """The strategy config a row runs: strategy_options[<strategy>] with the degree it names (Row.degrees)."""
    r = Row.parse(row)
    return OmegaConf.merge(cfg.strategy_options[r.base], r.degrees) if r.degrees else cfg.strategy_options[r.base]


def row_trainer(cfg, row: str):
    """The trainer config a row runs: cfg.trainer, with trainer.microbatches = cfg.pp_microbatches on a +pp row."""
    return OmegaConf.merge(cfg.trainer, {"microbatches": cfg.pp_microbatches}) if Row.parse(row).pp > 1 \
        else cfg.trainer


def check_rows_world(cfg, world: int) -> None:
    """Every row's tp, cp or pp degree divides the world; ValueError (one line naming `strategies`)."""
    bad = [row for row in cfg.strategies if world % Row.parse(row).size]
    if bad:
        keep = [row for row in cfg.strategies if row not in bad]
        kinds = " or ".join(sorted({Row.parse(row).dim for row in bad}, reverse=True))
        raise ValueError(f"strategies: {', '.join(bad)} need{'s' if len(bad) == 1 else ''} a world divisible by "
                         f"its {kinds} degree, and this one has {world} rank{'s' if world > 1 else ''}; run at such a "
                         f"world or leave {'it' if len(bad) == 1 else 'them'} out: "
                         f"strategies=[{','.join(keep)}]")


def _check_row(cfg, row: str) -> None:
    """A composed row's own rules, one line naming the row: tp's degree against the heads and width; cp's (a GPT
    without dropout whose block_size cuts into the chunks, an engine over one data-parallel dimension); pp's (the
    trainer's pipeline rules at the batch a pipeline shares, cfg.pp_microbatches micro-batches)."""
    r, so = Row.parse(row), row_strategy(cfg, row)
    try:
        if r.tp > 1:
            check_tensor_parallel(cfg.model.name, r.tp, f"strategies: {row}", f"drop the +tp{r.tp} rows")
            check_degree(cfg.model, r.tp, sequence_parallel=so.sequence_parallel, vocab_parallel=so.vocab_parallel,
                         setting=f"strategies: {row}'s tp", prefix="model.")
        if r.cp > 1:
            check_context_parallel(cfg.model.name, r.cp, f"strategies: {row}", f"drop the +cp{r.cp} rows")
            check_cp_degree(cfg.model, r.cp, cp_policy(so).chunking, setting=f"strategies: {row}'s cp",
                            prefix="model.")
            strategies.get(so.name).dims(so, r.cp, None)
        if r.pp > 1:
            trainer = OmegaConf.merge(row_trainer(cfg, row), {"batch_size": cfg.trainer.batch_size * r.pp})
            check_pipeline(types.SimpleNamespace(strategy=so, trainer=trainer, model=cfg.model))
    except ValueError as exc:
        shared = cfg.trainer.batch_size * r.pp
        msg = str(exc).replace("trainer.microbatches", "pp_microbatches").replace(
            f"trainer.batch_size={shared}", f"the {shared} sequences a pipeline shares (P x trainer.batch_size)")
        raise ValueError(msg if msg.startswith("strategies:") else f"strategies: {row}: {msg}") from None


def check_rows(cfg) -> None:
    """Every row of cfg.strategies parses, names a strategy_options key and a degree >= 2, leaves the presets'
    degrees at 1, and passes its dimension's rules; ValueError (one line)."""
    valid = list(cfg.strategy_options)
    no_tp = [r.name for r in strategies.records() if r.comparable and not r.tp_rows]
    rows = [Row.parse(s) for s in cfg.strategies]
    unknown = [s for s, r in zip(cfg.strategies, rows)
               if r.base not in valid or "+" in s and r.size < 2 or r.tp > 1 and r.base in no_tp]
    if unknown or not cfg.strategies:
        raise ValueError(f"strategies={list(cfg.strategies)}: {', '.join(unknown) or 'empty'} not valid; choose from "
                         f"{', '.join(valid)}, or <strategy>+tp<T> (T >= 2; not {', '.join(no_tp)}), "
                         f"<strategy>+cp<C> (C >= 2) or <strategy>+pp<P> (P >= 2)")
    for key, example in (("tp_size", "tp2"), ("cp_size", "cp2"), ("pp_size", "pp2")):
        preset = sorted({r.base for r in rows if cfg.strategy_options[r.base].get(key, 1) != 1})
        if preset:
            raise ValueError(f"strategy_options.{preset[0]}.{key} is set; leave it 1 and name the degree in "
                             f"strategies, e.g. strategies=[{preset[0]}+{example}]")
    if cfg.pp_microbatches < 1:
        raise ValueError(f"pp_microbatches={cfg.pp_microbatches} must be >= 1")
    for row in (s for s, r in zip(cfg.strategies, rows) if r.dim):
        _check_row(cfg, row)

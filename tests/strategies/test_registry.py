"""The registry: the strategies in the ladder's order, one-line lookups, and each strategy's name written
in one place (its record module and its preset file), everything else deriving from the records."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from minidist import strategies
from minidist.cli.config import CONFIG_DIR, groups
from minidist.compare.config import default_rows

ROOT = Path(__file__).resolve().parents[2]
LADDER = ("single", "ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard", "no_shard",
          "hybrid_shard")
FSDP1_NAMES = {"minidist/fsdp/api.py", "minidist/fsdp/footprint.py"}
"""The FSDP engine's own sharding_strategy values, FSDP1's names (issue 24 item 4 replaces them by FSDP2's
reshard_after_forward): the engine's vocabulary, not the registry's."""
NOT_STRATEGIES = {"minidist/tutorial/measure.py", "minidist/tutorial/check/rungs.py", "minidist/tutorial/check/zero.py"}
"""The build-it track's --part ddp|zero|fsdp and its rungs (zero1: the exercise): parts of a tutorial, not strategies."""


def test_the_ladder_and_lookups():
    assert strategies.names()[:len(LADDER)] == LADDER
    assert [r.zero_stage for r in strategies.records()[:len(LADDER)]] == [0, 0, 1, 2, 1, 2, 3, 0, 3]
    with pytest.raises(ValueError) as info:
        strategies.get("zero3")
    assert str(info.value) == f"unknown strategy 'zero3'; valid: {', '.join(strategies.names())}"
    clash = dataclasses.replace(strategies.get("ddp"), summary="another ddp")
    with pytest.raises(ValueError, match="registered already"):
        strategies.register(clash)
    assert strategies.register(strategies.get("ddp")) is strategies.get("ddp")  # the same record: a no-op


def test_what_derives_from_the_records():
    assert list(groups()["strategy"]) == list(strategies.names())
    assert default_rows() == ["ddp", "zero1", "zero2", "zero1_broadcast", "shard_grad_op", "full_shard",
                              "hybrid_shard", "ddp+tp2"]
    gb = {s: strategies.get(s).model_state_bytes(7.5e9, 64, 2, 2, 12)["total"] / 1e9
          for s in ("ddp", "zero1", "zero2", "full_shard")}
    assert [round(v, 1) for v in gb.values()] == [120.0, 31.4, 16.6, 1.9]  # ZeRO's Figure 1
    hybrid = strategies.get("hybrid_shard")
    assert hybrid.states_formula == "(p+g+K) psi/G" and strategies.get("zero2").states_formula == "p psi + (g+K) psi/N"
    # the shard group is the processes per node wherever it is asked: at runtime, in the estimate, the projection
    cfg = hybrid.preset()
    assert hybrid.dims(cfg, 64, 8).shard == hybrid.state_group(cfg, 64, 8) == 8
    assert hybrid.state_group(cfg, 4, 8) == 4 and hybrid.state_group(hybrid.preset(shard_size=2), 64, 8) == 2
    assert strategies.get("full_shard").state_group(strategies.get("full_shard").preset(tp_size=2), 8, 8) == 4
    with pytest.raises(ValueError, match="strategy full_shard has no setting shard_size; its settings: "):
        strategies.get("full_shard").preset(shard_size=2)


def _string_literals(path: Path) -> set[str]:
    """Every string constant of the module's code, docstrings left out."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs}


def test_a_strategys_name_is_written_in_its_record_and_its_preset_only():
    names = set(LADDER)
    spelled = {}
    for path in sorted((ROOT / "minidist").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("minidist/strategies/") or rel in FSDP1_NAMES | NOT_STRATEGIES:
            continue
        found = _string_literals(path) & names
        if found:
            spelled[rel] = sorted(found)
    assert not spelled, f"strategy names spelled outside minidist/strategies/ (ask the registry): {spelled}"
    owners = {}
    for path in sorted((ROOT / "minidist" / "strategies").glob("*.py")):
        for name in _string_literals(path) & names:
            owners.setdefault(name, set()).add(path.name)
    assert all(len(mods) == 1 for mods in owners.values()), owners  # one record module each


def test_each_preset_file_names_its_schema_and_nothing_else():
    """configs/strategy/<name>.yaml adds nothing to the record's schema: the comparison's strategy_options,
    built from the records, are what strategy=<name> composes."""
    files = {p.stem for p in (CONFIG_DIR / "strategy").glob("*.yaml")}
    assert files == set(LADDER)
    for name in files:
        preset = OmegaConf.load(CONFIG_DIR / "strategy" / f"{name}.yaml")
        assert OmegaConf.to_container(preset) == {"defaults": [f"/schema/strategy/{name}@_here_", "_self_"],
                                                  "name": name}, name

"""`--help`: the config groups with their choices, and every option with its value and description.

Hydra prints `hydra.help.template` (configs/config.yaml) for `--help`, resolved against
the config composed from the command line's overrides. Two resolvers fill it:

    ${minidist.groups:}    group: choice, choice, ...   (not the schema/ groups that hold the typed schemas;
                           ${minidist.groups:model,data}: those groups only)
    ${minidist.options:}   key: value    # description  (one line per field of the composed config)

The descriptions are the docstrings written under each field of the schemas (minidist/cli/config.py;
a strategy's in its record module, minidist/strategies/), read from the source with `ast`, so they
cannot drift from the code.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap

from omegaconf import DictConfig, OmegaConf

from minidist import strategies
from minidist.cli.config import CONFIG_DIR


def register_resolvers() -> None:
    OmegaConf.register_new_resolver("minidist.groups", groups_text, replace=True)
    OmegaConf.register_new_resolver("minidist.options", options_text, replace=True)


def groups_text(*only: str) -> str:
    """'group: a, b, c' per user-facing config group (the yaml presets under configs/, and every registered
    strategy); `only`: these groups (`${minidist.groups:model,data}`; the comparison has no strategy or
    experiment group)."""
    lines = []
    for group in sorted(p for p in CONFIG_DIR.iterdir() if p.is_dir() and (not only or p.name in only)):
        choices = {f.stem for f in group.glob("*.yaml")} | (set(strategies.names()) if group.name == "strategy"
                                                               else set())
        lines.append(f"{group.name}: {', '.join(sorted(choices))}")
    return "\n".join(lines)


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """{field: its docstring on one line} for a dataclass and its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (frozen or stripped install): no descriptions
            continue
        body = tree.body[0].body
        for stmt, nxt in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def _lines(node: DictConfig, prefix: str) -> list[str]:
    schema = OmegaConf.get_type(node)
    docs = field_docs(schema) if dataclasses.is_dataclass(schema) else {}
    out = []
    for key in node.keys():
        if key == "hydra":
            continue
        if OmegaConf.is_missing(node, key):
            out.append((f"{prefix}{key}", "???", docs.get(key, "")))
            continue
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            out.append((f"{prefix}{key}", "", docs.get(key, "")))
            out.extend(_lines(value, f"{prefix}{key}."))
        else:
            shown = OmegaConf.to_container(OmegaConf.create({"v": value._value()}), enum_to_str=True)["v"]
            text = "null" if shown is None else str(shown).lower() if isinstance(shown, bool) else str(shown)
            out.append((f"{prefix}{key}", text, docs.get(key, "")))
    return out


def options_text(*, _root_: DictConfig) -> str:
    """Every option of the composed config: `key: value  # description`, groups as headings."""
    rows = _lines(_root_, "")
    rows = [r for r in rows if "." not in r[0] and r[1]] + [r for r in rows if "." in r[0] or not r[1]]
    width = max(len(k) + len(v) for k, v, _ in rows if v) + 4
    text = []
    for key, value, doc in rows:
        if not value:  # a group: a heading
            text.append(f"{key}:  # {doc}" if doc else f"{key}:")
            continue
        entry = f"{'  ' * key.count('.')}{key}: {value}"
        text.append(f"{entry.ljust(width)}  # {doc}" if doc else entry)
    return "\n".join(text).replace("$", "$$")  # the help template is a string.Template

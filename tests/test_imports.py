"""minidist's import graph has no cycle.

Every module under minidist/ is parsed (ast, nothing imported) and every import
statement in it counts, wherever it sits: at the top, inside a function, or under
`if TYPE_CHECKING:` (a type-only import is still two modules that know each
other). `from package import name` points at the submodule package.name when
that is a module, else at the package. Importing a submodule also runs its
package's __init__, but that implicit edge is not counted: a package's __init__
re-exporting its submodules is not a cycle a reader has to untangle.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "minidist"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((ROOT / PKG).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    is_pkg = _modules_cache[module].name == "__init__.py"
    base = base if is_pkg else base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _edges(module: str, source: str, known: set[str]) -> set[str]:
    targets: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            src = _resolve(module, node)
            for a in node.names:
                sub = f"{src}.{a.name}"
                targets.add(sub if sub in known else src)
    return {t for t in targets if t in known and t != module}


_modules_cache = _modules()


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    color = {m: WHITE for m in graph}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        color[m] = GREY
        stack.append(m)
        for n in sorted(graph[m]):
            if color[n] == GREY:
                return stack[stack.index(n):] + [n]
            if color[n] == WHITE and (cycle := visit(n)):
                return cycle
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(graph):
        if color[m] == WHITE and (cycle := visit(m)):
            return cycle
    return None


def _graph() -> dict[str, set[str]]:
    known = set(_modules_cache)
    return {m: _edges(m, p.read_text(), known) for m, p in _modules_cache.items()}


def test_graph_covers_every_module_and_import_form():
    known = set(_modules_cache)
    assert {"minidist", "minidist.fsdp.unit", "minidist.fsdp.schedule", "minidist.fsdp.state_dict",
            "minidist.fsdp.api", "minidist.buckets.reducer", "minidist.train.trainer", "minidist.models.resnet"} <= known
    source = """
import minidist.comm.trace
from minidist import mesh, Topology
from minidist.fsdp.param import UnitShards
from . import all_gather
if TYPE_CHECKING:
    from minidist.fsdp.unit import FSDPUnit
def f():
    from .schedule import Schedule
"""
    assert _edges("minidist.fsdp.api", source, known) == {
        "minidist.comm.trace", "minidist.mesh", "minidist", "minidist.fsdp.param", "minidist.fsdp.all_gather",
        "minidist.fsdp.unit", "minidist.fsdp.schedule"}
    assert "minidist.comm" in _graph()["minidist.mesh"]


def test_cycle_detector_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_minidist():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)

"""minidist's import graph has no cycle, and no import runs back up a floor.

Every module under minidist/ is parsed (ast, nothing imported) and every import
statement in it counts, wherever it sits: at the top, inside a function, or under
`if TYPE_CHECKING:` (a type-only import is still two modules that know each
other). `from package import name` points at the submodule package.name when
that is a module, else at the package. Importing a submodule also runs its
package's __init__, but that implicit edge is not counted: a package's __init__
re-exporting its submodules is not a cycle a reader has to untangle.

FLOORS is the declared reading order of the packages, lowest first: a module may
import its own floor and the floors below, never one above (the training loop does
not know the command line; the engines do not know the strategies that use them).
A new package is placed in it, or the test says where it is missing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "minidist"

FLOORS: list[tuple[str, ...]] = [
    ("minidist.comm", "minidist.runtime", "minidist.verify", "minidist.sharding", "minidist.precision",
     "minidist.shape", "minidist.footprint", "minidist.mesh"),   # collectives, the process group, sizes, the mesh
    ("minidist.models",),                                        # the GPT and the ResNet
    ("minidist.buckets", "minidist.clip", "minidist.arguments"),  # below the engines: buckets, one clip, old names
    ("minidist.ddp", "minidist.zero", "minidist.fsdp", "minidist.tp"),  # the engines
    ("minidist.pp", "minidist.cp"),                              # the depth and the sequence, over the engines
    ("minidist",),                                               # the package's surface: DDP, FSDP, ShardedOptimizer
    ("minidist.tutorial",),                                      # the build-it track: the engines in miniature
    ("minidist.strategies",),                                    # one record per strategy, over the engines
    ("minidist.parallel",),                                      # composing a strategy's engines over a layout
    ("minidist.train",),                                         # the loop, its data, metrics and checkpoints
    ("minidist.cli",),                                           # configs, composition, --help, Hydra's jobs
    ("minidist.compare",),                                       # the strategies side by side
    ("minidist.recipes",),                                       # the command lines
]
"""Packages (and the root's modules) from the lowest floor up."""


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
    assert "minidist.comm" in _graph()["minidist.mesh.layout"]


def test_cycle_detector_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_minidist():
    cycle = _find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def floor_of(module: str) -> int | None:
    """The floor of `module`: the one of the longest declared name it is, or lies inside."""
    best = None
    for i, names in enumerate(FLOORS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (best is None or len(name) > len(best[1])):
                best = (i, name)
    return None if best is None else best[0]


def test_every_module_has_a_floor():
    missing = sorted(m for m in _modules_cache if floor_of(m) is None)
    assert not missing, f"modules on no floor (add their package to FLOORS): {missing}"


def test_no_import_runs_up_a_floor():
    up = sorted(f"{m} (floor {floor_of(m)}) imports {t} (floor {floor_of(t)})"
                for m, targets in _graph().items() for t in targets if floor_of(t) > floor_of(m))
    assert not up, "imports that run up a floor:\n" + "\n".join(up)


def test_the_floor_check_finds_an_upward_import():
    assert floor_of("minidist.train.trainer") < floor_of("minidist.cli.compose")
    assert floor_of("minidist.shape") == floor_of("minidist.mesh") == 0
    assert floor_of("minidist") < floor_of("minidist.strategies.record")
    known = set(_modules_cache)
    assert "minidist.cli.compose" in _edges("minidist.train.trainer", "from minidist.cli.compose import x", known)

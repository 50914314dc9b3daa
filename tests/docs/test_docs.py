"""No drift between the documentation and the code.

Every name in code font in docs/*.md that looks like a piece of minidist (a dotted
name starting with a minidist module or an exported name, such as
`minidist.ddp.Reducer.prepare_for_forward` or `comm.trace`) must import or resolve
by getattr, and every file or folder path (`minidist/buckets/reducer.py`, `recipes/`)
must exist. The site itself must build with `mkdocs build --strict`, which also
fails on a missing page, a broken link, a missing snippet of docs/generated/, or
a `::: module` reference that no longer resolves.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import minidist

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "generated" not in p.parts)

FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?$")
PATH = re.compile(r"^(?:\.venv/bin/)?([\w.-]+/(?:[\w.-]+/)*[\w.-]*)$")
TOP_DIRS = {"minidist", "recipes", "benchmarks", "tests", "scripts", "checks", "launch", "configs", "docs"}


def _namespace() -> dict[str, object]:
    """First segments that mean 'minidist': its modules and every name its packages export."""
    names: dict[str, object] = {"minidist": minidist, "recipes": importlib.import_module("recipes")}
    for pkg in ("minidist", "minidist.comm", "minidist.ddp", "minidist.zero", "minidist.fsdp"):
        mod = importlib.import_module(pkg)
        for name in getattr(mod, "__all__", []):
            names.setdefault(name, getattr(mod, name))
    return names


NAMESPACE = _namespace()


def code_spans(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [m.group(1).strip() for m in CODE_SPAN.finditer(text)]


def resolve(dotted: str) -> None:
    """Import the longest importable prefix, getattr the rest; raise if anything is missing."""
    parts = dotted.split(".")
    if parts[0] not in ("minidist", "recipes"):
        obj = NAMESPACE[parts[0]]
        for attr in parts[1:]:
            obj = getattr(obj, attr)
        return
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return
    raise ModuleNotFoundError(dotted)


def references() -> list[tuple[str, str, str]]:
    """(page, kind, text) for every code reference the docs make."""
    refs = []
    for page in PAGES:
        rel = str(page.relative_to(ROOT))
        for span in code_spans(page):
            for token in span.split():
                m = DOTTED.match(token)
                if m and m.group(1).split(".")[0] in NAMESPACE:
                    refs.append((rel, "name", m.group(1)))
                p = PATH.match(token)
                if p and p.group(1).split("/")[0] in TOP_DIRS:
                    refs.append((rel, "path", p.group(1)))
    return refs


def test_docs_name_code_at_all():
    """The checks below would pass vacuously if the scanner found nothing."""
    kinds = [k for _, k, _ in references()]
    assert kinds.count("name") > 50 and kinds.count("path") > 30, (kinds.count("name"), kinds.count("path"))


def test_every_named_module_function_and_file_exists():
    missing = []
    for page, kind, text in references():
        if kind == "path":
            if not (ROOT / text).exists():
                missing.append(f"{page}: file {text}")
        else:
            try:
                resolve(text)
            except (AttributeError, ImportError) as e:
                missing.append(f"{page}: {text} ({type(e).__name__}: {e})")
    assert not missing, "docs name code that does not exist:\n" + "\n".join(missing)


def test_resolver_catches_a_stale_name():
    with pytest.raises(AttributeError):
        resolve("minidist.ddp.Reducer.no_such_method")
    with pytest.raises(AttributeError):
        resolve("comm.no_such_collective")
    resolve("minidist.comm.all_reduce")


def test_every_lesson_has_a_section_and_generated_output():
    from recipes.lessons import LESSONS
    text = (DOCS / "lessons.md").read_text()
    for name in LESSONS:
        assert f"recipes/lessons/{name}.py" in text, name
        assert f'--8<-- "lesson_{name}.md"' in text, name
        assert (DOCS / "generated" / f"lesson_{name}.md").exists(), name


def test_site_builds_strictly(built_site):
    """The build itself is tests/docs/conftest.py's built_site (shared with test_offline.py); it fails there."""
    assert (built_site / "index.html").is_file()


def test_state_diagram_labels_parse():
    """Mermaid ends a stateDiagram transition's label at the next ':' or ';', and a diagram it cannot parse
    shows as raw text on the page (the DDP bucket diagram did, seen in Chromium): one ':' per transition."""
    bad = []
    for page in DOCS.rglob("*.md"):
        for block in re.findall(r"```mermaid\n(stateDiagram.*?)```", page.read_text(), flags=re.S):
            bad += [f"{page.relative_to(DOCS)}: {line.strip()}" for line in block.splitlines()
                    if "-->" in line and (line.count(":") > 1 or ";" in line)]
    assert not bad, "\n".join(bad)

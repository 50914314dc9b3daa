"""One reading order: mkdocs.yml's nav, README.md's "Read it in this order", docs/index.md's and the track's
page list the same pages in the same order (terms first, the track before the engines, the mesh after them)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            out += _nav_pages(value)
        elif not value.startswith("api/"):
            out.append(value)
    return out


def nav_order() -> list[str]:
    class Loader(yaml.SafeLoader):
        pass
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    return _nav_pages(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"])


def _section(text: str, start: str, end: str) -> str:
    return text[text.index(start):text.index(end, text.index(start))]


def readme_order() -> list[str]:
    section = _section((ROOT / "README.md").read_text(), "## Read it in this order", "\n## ")
    return re.findall(r"`docs/([\w/]+\.md)`", section)


def _links(section: str, base: str) -> list[str]:
    pages = []
    for link in re.findall(r"\]\(([\w./]+\.md)(?:#[\w-]*)?\)", section):
        page = str((Path(base) / link).as_posix())
        page = page.replace("tutorial/../", "")
        if page not in pages:
            pages.append(page)
    return pages


def index_order() -> list[str]:
    section = _section((ROOT / "docs" / "index.md").read_text(), "Read it in this order", "## The words")
    return ["index.md"] + _links(section, ".")


def track_order() -> list[str]:
    section = _section((ROOT / "docs" / "tutorial" / "index.md").read_text(), "Where the track sits", "\n## ")
    return _links(section, "tutorial")


def test_the_reading_order_is_one_list():
    nav = nav_order()
    assert nav[:2] == ["index.md", "collectives.md"] and nav[2] == "tutorial/index.md", nav  # terms, then the track
    assert nav.index("mesh.md") > max(nav.index(p) for p in ("ddp.md", "zero.md", "fsdp.md", "tp.md")), nav
    assert readme_order() == nav, f"README.md: {readme_order()}\nmkdocs.yml: {nav}"
    assert index_order() == nav, f"docs/index.md: {index_order()}\nmkdocs.yml: {nav}"
    track = [p.removeprefix("./") for p in track_order()]
    assert track == nav, f"docs/tutorial/index.md: {track}\nmkdocs.yml: {nav}"


def test_every_track_page_is_a_rung_page_in_the_registry_order():
    from minidist.tutorial.check.rungs import RUNGS
    pages = []
    for rung in RUNGS.values():
        page = rung.page.removeprefix("docs/")
        if page not in pages:
            pages.append(page)
    nav = [p for p in nav_order() if p.startswith("tutorial/") and p != "tutorial/index.md"]
    assert pages == nav, (pages, nav)

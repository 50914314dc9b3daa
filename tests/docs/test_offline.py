"""The built site loads nothing from outside itself, and draws its diagrams with the vendored Mermaid.

Offline (and on this machine) anything a page fetches from another host is missing: Material's
Google Fonts, Mermaid from a CDN. The site is built once (mkdocs build --strict) and every page
and stylesheet is scanned for what a browser would fetch: script, stylesheet, font, image, frame,
and url()/@import in CSS. Links a reader clicks (<a href>) are not fetched and are allowed.
Material's JavaScript fetches Mermaid from a CDN only when no `mermaid` is on the page, so every
page with a diagram must load the vendored copy, which must be the file SOURCE.txt names.
"""

from __future__ import annotations

import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENDOR = ROOT / "docs" / "assets" / "vendor" / "mermaid"
MERMAID_JS = "assets/vendor/mermaid/mermaid.min.js"
EXTERNAL = re.compile(r"^\s*(?:[a-zA-Z][\w+.-]*:)?//")   # http://, https://, //host: another host
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)|@import\s+['"]([^'"]+)""")
FETCHED = {"script": ["src"], "link": ["href"], "img": ["src", "srcset"], "iframe": ["src"], "frame": ["src"],
           "source": ["src", "srcset"], "video": ["src", "poster"], "audio": ["src"], "embed": ["src"],
           "object": ["data"], "track": ["src"], "input": ["src"]}


class Fetches(HTMLParser):
    """What a browser fetches for one HTML document: (what, url) pairs; and whether it draws Mermaid."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.urls: list[tuple[str, str]] = []
        self.has_mermaid = False
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if "mermaid" in (attrs.get("class") or "").split():
            self.has_mermaid = True
        for name in FETCHED.get(tag, []):
            if attrs.get(name):
                urls = [u.strip().split()[0] for u in attrs[name].split(",") if u.strip()] if name == "srcset" \
                    else [attrs[name]]
                self.urls += [(f"<{tag} {name}>", u) for u in urls]
        if attrs.get("style"):
            self.urls += [("style attribute", u) for u in css_urls(attrs["style"])]
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.urls += [("<style>", u) for u in css_urls(data)]


def css_urls(css: str) -> list[str]:
    return [a or b for a, b in CSS_URL.findall(css) if not (a or b).startswith("data:")]


def external_fetches(site: Path) -> list[str]:
    """'page: what url' for every fetch of another host, over every page and stylesheet of `site`."""
    bad = []
    for page in sorted(site.rglob("*.html")):
        parser = Fetches()
        parser.feed(page.read_text(encoding="utf-8"))
        bad += [f"{page.relative_to(site)}: {what} {url}" for what, url in parser.urls if EXTERNAL.match(url)]
    for css in sorted(site.rglob("*.css")):
        bad += [f"{css.relative_to(site)}: url {u}" for u in css_urls(css.read_text(encoding="utf-8"))
                if EXTERNAL.match(u)]
    return bad


@pytest.fixture
def site(built_site) -> Path:
    return built_site  # tests/docs/conftest.py: built once per session


def test_no_page_or_stylesheet_fetches_from_another_host(site):
    pages = list(site.rglob("*.html"))
    assert len(pages) > 15, f"only {len(pages)} pages built: the scan would prove little"
    bad = external_fetches(site)
    assert not bad, "the site loads from outside itself (offline these are missing):\n" + "\n".join(bad[:40])


def test_every_page_with_a_diagram_loads_the_vendored_mermaid(site):
    with_diagrams = []
    for page in sorted(site.rglob("*.html")):
        parser = Fetches()
        parser.feed(page.read_text(encoding="utf-8"))
        if parser.has_mermaid:
            with_diagrams.append(page)
            scripts = [u for what, u in parser.urls if what == "<script src>"]
            assert any(u.split("?")[0].endswith(MERMAID_JS) for u in scripts), \
                f"{page.relative_to(site)} has a diagram but does not load {MERMAID_JS}: Material would fetch a CDN copy"
            assert (page.parent / next(u for u in scripts if MERMAID_JS in u).split("?")[0]).resolve().is_file()
    # the engine pages draw diagrams (DDP's buckets, FSDP's unit, the ring, the mesh, the track's)
    assert len(with_diagrams) >= 4 and "tutorial" in {p.relative_to(site).parts[0] for p in with_diagrams}, \
        [str(p.relative_to(site)) for p in with_diagrams]


def test_vendored_mermaid_is_the_npm_file_named_in_source_txt():
    source = (VENDOR / "SOURCE.txt").read_text()
    version = re.search(r"^package:\s+mermaid@(\S+)", source, re.M).group(1)
    digest = re.search(r"^sha256:\s+([0-9a-f]{64})\s+mermaid\.min\.js", source, re.M).group(1)
    js = (VENDOR / "mermaid.min.js").read_bytes()
    assert hashlib.sha256(js).hexdigest() == digest, "mermaid.min.js is not the file SOURCE.txt names"
    assert f'version:"{version}"'.encode() in js, f"mermaid.min.js does not say it is version {version}"
    assert "MIT License" in (VENDOR / "LICENSE").read_text()


def test_the_scan_catches_fonts_scripts_and_css_from_elsewhere(tmp_path):
    (tmp_path / "index.html").write_text(
        '<html><head><link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto">'
        '<link rel="preconnect" href="//fonts.gstatic.com"><script src="assets/local.js"></script>'
        '<script src="https://unpkg.com/mermaid@11/dist/mermaid.min.js"></script>'
        '<style>@import "http://example.org/a.css"; body{background:url(data:image/png;base64,AA)}</style>'
        '</head><body><a href="https://pytorch.org">fine: a link is not fetched</a>'
        '<img srcset="local.png 1x, https://example.org/b.png 2x"></body></html>')
    (tmp_path / "x.css").write_text("@font-face{src:url('https://fonts.gstatic.com/r.woff2')} a{b:url(img/ok.svg)}")
    bad = external_fetches(tmp_path)
    assert len(bad) == 6, bad
    assert not any("pytorch.org" in b or "local" in b or "ok.svg" in b for b in bad), bad

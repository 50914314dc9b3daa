"""scripts/install_venv.py, the Makefile's installer: what it asks pip for and how it splits the work.
A fresh clone's `make test` (CI) runs the whole installer; these check its parts."""

import importlib.util
from importlib import metadata
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("install_venv", Path(__file__).resolve().parents[1] / "scripts" / "install_venv.py")
install_venv = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(install_venv)


def _item(name, version, url):
    return {"metadata": {"name": name, "version": version}, "download_info": {"url": url}}


def test_it_asks_for_the_dependencies_the_dev_extra_and_the_build_backend():
    reqs = install_venv.requirements()
    names = {r.split(">")[0].split("<")[0].split("[")[0] for r in reqs}
    assert {"torch", "hydra-core", "pytest-xdist", "mkdocs", "setuptools"} <= names, reqs


def test_the_halves_are_disjoint_complete_and_about_equal_in_bytes(tmp_path):
    sizes = [900, 500, 450, 300, 200, 10, 1]
    items = []
    for i, kib in enumerate(sizes):
        wheel = tmp_path / f"p{i}-1.0-py3-none-any.whl"
        wheel.write_bytes(b"\0" * kib * 1024)
        items.append(_item(f"p{i}", "1.0", wheel.as_uri()))
    items.append(_item("remote", "2.0", "https://files.example/remote-2.0-py3-none-any.whl"))  # 1 MiB nominal
    a, b = install_venv.halves(items)
    assert sorted(a + b) == sorted(f"{i['metadata']['name']} @ {i['download_info']['url']}" for i in items)
    weight = {f"{i['metadata']['name']} @ {i['download_info']['url']}": install_venv.weight(i) for i in items}
    gap = abs(sum(map(weight.get, a)) - sum(map(weight.get, b)))
    assert gap <= max(weight.values()), (a, b)  # greedy largest-first: within one wheel of even


def test_installed_means_the_resolved_version_is_here():
    version = metadata.version("torch")  # 2.14.1, where torch.__version__ adds +cu130
    assert install_venv.installed(_item("torch", version, "file:///x.whl"))
    assert not install_venv.installed(_item("torch", "0.0.1", "file:///x.whl"))
    assert not install_venv.installed(_item("no-such-distribution-here", "1.0", "file:///x.whl"))

"""Every torch.load in the project passes weights_only=True: no example, test or script teaches loading a
pickle that can run code. Python files are read as syntax trees (a call spread over lines, or with the
keyword in another place, is still one call); Markdown by text."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = {".venv", "site", "build", "outputs", ".git"}


def _files(suffix: str) -> list[Path]:
    return [p for p in ROOT.rglob(f"*{suffix}") if not SKIP & set(p.relative_to(ROOT).parts)]


def _unsafe_calls(path: Path, root: Path = ROOT) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
            safe = any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                       for k in node.keywords)
            if not safe:
                out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def test_every_torch_load_is_weights_only():
    py = _files(".py")
    assert len(py) > 100 and any(p.name == "checkpoint_files.py" for p in py)  # the walk sees the project
    unsafe = [hit for p in py for hit in _unsafe_calls(p)]
    md = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in _files(".md")
          for m in re.finditer(r"torch\.load\([^)]*\)", p.read_text()) if "weights_only=True" not in m.group(0)]
    assert not unsafe and not md, unsafe + md


def test_the_check_finds_an_unsafe_load(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.load(\n    'f.pt',\n    weights_only=False)\ny = torch.load('g.pt')\n"
                   "z = torch.load('h.pt', map_location='cpu', weights_only=True)\n")
    assert _unsafe_calls(bad, tmp_path) == ["bad.py:2", "bad.py:5"]

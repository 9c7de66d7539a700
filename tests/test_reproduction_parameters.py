"""Every reproduction notebook's parameters can be overridden with ``papermill -p``.

papermill infers a notebook's parameters from its ``parameters`` cell line by line and silently drops
a line it cannot parse (it logs ``Unable to parse line ...``): that knob can then not be named with
``-p`` or by ``pipelab reproduce``. The oracle is Python's own parser on the same cell: every name the
cell assigns must be one papermill infers, with the same default value.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

papermill = pytest.importorskip("papermill")

REPRODUCTIONS = Path(__file__).resolve().parents[1] / "reproductions"
NOTEBOOKS = sorted(REPRODUCTIONS.glob("*/*.ipynb"))


def parameters_cell(nb: Path) -> str:
    """The source of the notebook's cell tagged ``parameters``."""
    cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
    tagged = [c for c in cells if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{nb.name}: {len(tagged)} cells tagged 'parameters', expected one"
    src = tagged[0]["source"]
    return "".join(src) if isinstance(src, list) else src


def assigned(source: str) -> dict[str, object]:
    """Each name the cell assigns with its literal value (Python's parser: the oracle)."""
    out = {}
    for node in ast.parse(source).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, ast.dump(node)[:200]
        target = node.targets[0]
        assert isinstance(target, ast.Name), ast.dump(node)[:200]
        out[target.id] = ast.literal_eval(node.value)
    return out


def test_there_are_reproduction_notebooks() -> None:
    assert len(NOTEBOOKS) >= 5, NOTEBOOKS


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.parent.name)
def test_papermill_infers_every_parameter_of_the_cell(nb: Path) -> None:
    expected = assigned(parameters_cell(nb))
    inferred = papermill.inspect_notebook(str(nb))
    missing = sorted(set(expected) - set(inferred))
    assert not missing, f"{nb.name}: papermill cannot parse the line(s) of {missing}; `-p` cannot set them"
    for name, value in expected.items():
        assert ast.literal_eval(inferred[name]["default"]) == value, (name, inferred[name])

"""Every stored notebook is what its jupytext percent-format ``.py`` source converts to.

The ``.py`` beside each ``.ipynb`` (same stem) under ``notebooks/`` and ``reproductions/`` is the file
people edit and review; ``make notebooks`` writes the ``.ipynb`` from it. These tests convert each source
with jupytext (no kernel) and compare the cells, so a source edited without regenerating its notebook,
or a notebook edited without its source, fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jupytext
import pytest

REPO = Path(__file__).resolve().parents[1]
STORED = sorted([*REPO.glob("notebooks/*.ipynb"), *REPO.glob("reproductions/**/*.ipynb")])
FIX = "regenerate it with `make notebooks` (or `jupytext --to ipynb --update SOURCE.py`)"

Cell = tuple[str, str, dict[str, Any]]


def stored_cells(ipynb: Path) -> list[Cell]:
    """The (cell type, source, metadata) of each cell of a stored ``.ipynb``, read as plain JSON."""
    nb = json.loads(ipynb.read_text(encoding="utf-8"))
    return [(c["cell_type"], "".join(c["source"]), c["metadata"]) for c in nb["cells"]]


def source_cells(py: Path) -> list[Cell]:
    """The (cell type, source, metadata) of each cell jupytext reads from a percent-format source."""
    nb = jupytext.read(py, fmt="py:percent")
    return [(c.cell_type, c.source, dict(c.metadata)) for c in nb.cells]


def cell_differences(py: Path, ipynb: Path) -> list[str]:
    """How the cells of ``ipynb`` differ from those its source ``py`` converts to (empty: in sync)."""
    want, have = source_cells(py), stored_cells(ipynb)
    problems = []
    if len(want) != len(have):
        problems.append(f"{py.name} has {len(want)} cells, {ipynb.name} has {len(have)}")
    for i, (w, h) in enumerate(zip(want, have)):
        for what, a, b in zip(("type", "source", "metadata"), w, h):
            if a != b:
                problems.append(f"cell {i}: {what} differs\n  source:   {a!r}\n  notebook: {b!r}")
    return problems


def test_every_notebook_is_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in STORED}
    assert len([n for n in names if n.startswith("notebooks/")]) == 10, names
    assert {"reproductions/pipedream_table1/table1.ipynb", "reproductions/hetpipe/hetpipe.ipynb",
            "reproductions/weight_stashing/weight_stashing.ipynb",
            "reproductions/weight_buffer/weight_buffer.ipynb"} <= names


def test_jupytext_pairs_notebooks_with_percent_sources() -> None:
    # notebooks/ has its own copy: `make lab` serves it as the root, above which jupytext does not look
    for config in (REPO / "jupytext.toml", REPO / "notebooks" / "jupytext.toml"):
        assert '\nformats = "ipynb,py:percent"\n' in config.read_text(encoding="utf-8"), config


@pytest.mark.parametrize("ipynb", STORED, ids=lambda p: p.relative_to(REPO).as_posix())
def test_notebook_matches_its_percent_source(ipynb: Path) -> None:
    py = ipynb.with_suffix(".py")
    assert py.exists(), f"{ipynb.relative_to(REPO)} has no jupytext source {py.name}"
    text = py.read_text(encoding="utf-8")
    assert "#       format_name: percent\n" in text and "\n# %%" in text, f"{py.name}: not percent format"
    problems = cell_differences(py, ipynb)
    assert not problems, f"{ipynb.relative_to(REPO)} differs from {py.name}; {FIX}:\n" + "\n".join(problems)


def test_the_comparison_reports_a_notebook_out_of_sync(tmp_path: Path) -> None:
    """Edited sources (a changed line, a lost tag, a dropped cell) are reported against the stored one."""
    ipynb = REPO / "notebooks" / "01_quickstart.ipynb"
    text = ipynb.with_suffix(".py").read_text(encoding="utf-8")
    assert cell_differences(ipynb.with_suffix(".py"), ipynb) == []

    edited = tmp_path / "01_quickstart.py"
    assert "\nsteps = 600 " in text
    edited.write_text(text.replace("\nsteps = 600 ", "\nsteps = 601 ", 1), encoding="utf-8")
    problems = cell_differences(edited, ipynb)
    assert len(problems) == 1 and problems[0].startswith("cell 1: source differs"), problems

    assert '# %% tags=["parameters"]\n' in text
    edited.write_text(text.replace('# %% tags=["parameters"]\n', "# %%\n", 1), encoding="utf-8")
    problems = cell_differences(edited, ipynb)
    assert len(problems) == 1 and problems[0].startswith("cell 1: metadata differs"), problems

    last = text.rindex("\n# %%")
    edited.write_text(text[:last + 1], encoding="utf-8")
    problems = cell_differences(edited, ipynb)
    n = len(source_cells(ipynb.with_suffix(".py")))
    assert problems and f"has {n - 1} cells, 01_quickstart.ipynb has {n}" in problems[0], problems

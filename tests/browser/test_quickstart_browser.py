"""The quickstart as a new user meets it: JupyterLab in headless Chromium, Run All, nothing edited.

The stored ``notebooks/01_quickstart.ipynb`` (default parameters: 2 gloo worker processes) is opened in
a private JupyterLab (H5's :mod:`labdriver`) and run with Run > Run All Cells. We check in the DOM that
every cell finished without an error or a widget error, that the partition graph and the simulated
Gantt are drawn, that the live Gantt of the real 2-process run holds at least one box per action of the
schedule, and that the measured Gantt drawn after the run shows exactly the same boxes as the live one.
(That the live chart fills in gradually is checked by ``test_browser.py`` with a job paced to last; the
quickstart's job can end between two samples, so here the partial counts seen are only printed.)
A screenshot goes to ``tests/browser/out/quickstart.png``.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import labdriver as L
import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
NOTEBOOK = REPO / "notebooks" / "01_quickstart.ipynb"
OUT = HERE / "out"

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(420)]


def defaults() -> dict[str, Any]:
    """The quickstart's parameters as stored (what a new user runs)."""
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    values: dict[str, Any] = {}
    exec("".join(cell["source"]), {}, values)  # the cell is plain assignments of literals
    return values


def code_cells(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """The probe's code cells (the quickstart's cells carry no ``# [name]`` tags: use their order)."""
    return list(sample["cells"])


def test_quickstart_runs_unedited_in_jupyterlab(chromium: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    p = defaults()
    assert p["backend"] == "gloo", "the quickstart must default to real processes"
    # one minibatch per step: F and B per stage and microbatch, one U per stage (a straight pipeline)
    actions = p["steps"] * (2 * p["workers"] * p["microbatches"] + p["workers"])
    OUT.mkdir(exist_ok=True)
    root = tmp_path / "nb"
    L.copy_inputs([NOTEBOOK], root)
    t_start = time.time()
    with L.jupyter_lab(root, tmp_path) as lab, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=L.CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        page_errors: list[str] = []
        page.on("pageerror", lambda e: page_errors.append(str(e)[:300]))
        page.goto(lab.url(NOTEBOOK.name))
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-CodeCell", timeout=90_000)
        t0 = time.time()
        while lab.kernel_state() != "idle":
            assert time.time() - t0 < 90, "the kernel never became idle"
            time.sleep(0.3)

        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        t0 = time.time()
        live_counts: set[int] = set()
        while True:
            s = page.evaluate(L.PROBE)
            cells = code_cells(s)
            if not L.finished(cells[7]["prompt"]) and cells[6]["plots"]:  # the live Gantt while the job runs
                live_counts.add(cells[6]["plots"][0]["bars"])
            if all(L.finished(c["prompt"]) for c in cells) and lab.kernel_state() == "idle":
                break
            assert s["errors"] == 0, "a cell failed:\n" + "\n".join(c["text"][-1500:] for c in cells
                                                                   if "Error" in c["text"])
            assert time.time() - t0 < 300, f"Run All did not finish: prompts {[c['prompt'] for c in cells]}"
            page.wait_for_timeout(200)
        run_all_s = time.time() - t0
        page.wait_for_timeout(800)                                   # the last redraws
        s = page.evaluate(L.PROBE)
        cells = code_cells(s)
        assert s["errors"] == 0 and s["widget_errors"] == 0, \
            f"{s['errors']} errors, {s['widget_errors']} widget errors:\n" + \
            "\n".join(c["text"][-1500:] for c in cells if "Error" in c["text"])

        assert len(cells) == 9, f"expected the quickstart's 9 code cells, found {len(cells)}"
        calibrated = cells[3]
        assert "calibrated on" in calibrated["text"], "the calibration cell did not describe the machine"
        partition, simulated, live, measured, losses = cells[4], cells[5], cells[6], cells[7], cells[8]
        assert partition["plots"], "the partition graph was not drawn"
        assert "straight" in partition["text"]
        assert simulated["plots"] and simulated["plots"][0]["bars"] >= actions, simulated["plots"]
        assert live["plots"], "the live Gantt was not drawn"
        live_bars = live["plots"][0]["bars"]
        assert live_bars >= actions, f"live Gantt shows {live_bars} boxes for {actions} actions"
        assert measured["plots"] and measured["plots"][0]["bars"] == live_bars, \
            "the measured Gantt (from run.trace) and the live one (from the event stream) differ"
        assert "steady state: measured" in measured["text"] and "error" in measured["text"]
        assert losses["plots"], "the loss curve was not drawn"

        live_cell = page.locator(".jp-CodeCell").nth(6)
        live_cell.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        page.screenshot(path=str(OUT / "quickstart.png"))
        browser.close()
    print(
        f"\nquickstart in JupyterLab: Run All {run_all_s:.1f} s (total {time.time() - t_start:.1f} s); "
        f"{actions} actions, live Gantt {live_bars} boxes, {len(live_counts)} distinct counts while running; "
        f"page errors {page_errors[:3]}"
    )

"""The widgets in a real browser: JupyterLab + headless Chromium, and the offline HTML report.

1. JupyterLab (private, headless) opens ``widgets_check.ipynb`` in Chromium and runs all cells. We
   check in the DOM that the Gantt boxes are drawn (one per action), that moving a ScheduleExplorer
   slider and dropdown redraws its chart, that the live Gantt of a real 2-process gloo job
   (``pl.launch``) fills in while the job runs, and that no error or widget error appears. A
   screenshot goes to ``tests/browser/out/``. That the 64-worker x 512-microbatch Gantt is drawn is
   checked here; how fast it draws is ``reproductions/benchmarks/gantt_render.py``'s figure.
2. papermill runs the same notebook without a front end; nbconvert makes HTML; Chromium opens it
   from file:// with networking off and counts the drawn boxes.

Chromium is Debian's package, installed by ``ensure_chromium.sh`` when missing; the tests skip, saying
why, only when it cannot be installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import labdriver as L
import pytest

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
NOTEBOOK = HERE / "widgets_check.ipynb"
INPUTS = [NOTEBOOK, HERE / "livejob.py"]
P, M = 4, 8                                 # the notebook's default stages and microbatches

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]


def boxes(stages: int, microbatches: int) -> int:
    """Actions of a one-minibatch sync schedule: F and B per stage and microbatch, one U per stage."""
    return 2 * stages * microbatches + stages


def number(text: str, key: str) -> float:
    """The number after ``key`` in a cell's printed output."""
    m = re.search(rf"{key} ([\d.]+)", text)
    assert m, f"{key} not printed; output was:\n{text[-1500:]}"
    return float(m.group(1))


def test_stored_notebook_is_generated():
    """The committed notebook is exactly what make_notebook.py writes (edit the script, not the JSON)."""
    sys.path.insert(0, str(HERE))
    import make_notebook

    assert NOTEBOOK.read_text(encoding="utf-8") == make_notebook.text()


def test_widgets_in_jupyterlab(chromium: str, tmp_path: Path):
    from playwright.sync_api import sync_playwright

    OUT.mkdir(exist_ok=True)
    root = tmp_path / "nb"
    L.copy_inputs(INPUTS, root)
    summary: dict[str, Any] = {}
    t_start = time.time()
    with L.jupyter_lab(root, tmp_path) as lab, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=L.CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        console: list[str] = []
        page.on("pageerror", lambda e: console.append("pageerror: " + str(e)[:300]))
        page.goto(lab.url(NOTEBOOK.name))
        page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-CodeCell", timeout=90_000)
        t0 = time.time()
        while lab.kernel_state() != "idle":
            assert time.time() - t0 < 90, "the kernel never became idle"
            time.sleep(0.3)
        summary["lab_ready_s"] = round(time.time() - t_start, 1)

        # ---- Run > Run All Cells; sample the live cell's chart while its job runs
        page.evaluate(L.SAMPLER, ["live"])
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        t0 = time.time()
        while True:
            s = page.evaluate(L.PROBE)
            if all(L.finished(c["prompt"]) for c in s["cells"]) and lab.kernel_state() == "idle":
                break
            assert time.time() - t0 < 240, (
                f"Run All did not finish: prompts {[c['prompt'] for c in s['cells']]}"
            )
            page.wait_for_timeout(150)
        summary["run_all_s"] = round(time.time() - t0, 1)
        page.wait_for_timeout(500)                  # let the last redraws land
        s = page.evaluate(L.PROBE)
        assert s["errors"] == 0 and s["widget_errors"] == 0, \
            f"{s['errors']} error outputs, {s['widget_errors']} widget errors: " + \
            "\n".join(c["text"][-800:] for c in s["cells"] if "Error" in c["text"])

        # every Gantt's legend is clear of its title and bars (the live one's title once read
        # "live job — bubble 5…" under the legend)
        gantts = [(ci, j, plot) for ci, plots in enumerate(page.evaluate(L.GEOMETRY))
                  for j, plot in enumerate(plots) if "bubble" in plot["titleText"]]
        assert len(gantts) >= 3, f"expected the schedule, explorer and live Gantts, found {len(gantts)}"
        for ci, j, plot in gantts:
            L.check_legend_clear(plot, f"cell {ci} chart {j}")
        summary["gantt_legends_clear"] = len(gantts)

        # Gantt of a bare schedule: one drawn box per action
        g = L.cell(s, "gantt")
        assert number(g["text"], "GANTT_BOXES") == boxes(P, M)
        assert [p["bars"] for p in g["plots"]] == [boxes(P, M)]
        assert "bubble 27.3%" in g["plots"][0]["title"]          # (P-1)/(M+P-1)

        # the explorer shows its Gantt (and its memory chart) for the initial controls
        ex = L.cell(s, "explorer")
        assert len(ex["plots"]) == 2 and ex["plots"][0]["bars"] == boxes(P, M)
        assert ex["plots"][0]["title"].startswith(f"gpipe: P={P} M={M}")

        # the plan explorer drew a partition graph and its config line
        pe = L.cell(s, "plans")
        assert len(pe["plots"]) == 1 and "config" in pe["text"] and "speed-up" in pe["text"]

        # the live Gantt grew while the job ran, and ends with one box per action and transfer
        live = L.cell(s, "live")
        final = int(number(live["text"], "LIVE_BOXES"))
        assert live["plots"] and live["plots"][0]["bars"] == final
        samples = page.evaluate("window.__samples")
        growth = sorted(
            {x["cells"]["live"]["bars"] for x in samples if x["cells"]["live"]["prompt"] == "[*]:"}
        )
        summary["live_distinct_counts_while_running"] = len(growth)
        summary["live_counts"] = growth[:4] + growth[-2:]
        assert len([c for c in growth if 0 < c < final]) >= 2 and len(growth) >= 3, \
            f"live chart did not fill in gradually: counts seen while the job ran {growth} (final {final})"

        big = L.cell(s, "big")
        assert big["plots"] and big["plots"][0]["images"] >= 1, "the 64x512 Gantt was not drawn"

        # ---- a widget control changes the figure: slider (keyboard), then dropdown
        slider = page.locator(".widget-slider", has_text="microbatches M").first
        slider.scroll_into_view_if_needed()
        slider.locator(".noUi-handle").focus()
        page.keyboard.press("ArrowRight")
        page.wait_for_function(
            "() => [...document.querySelectorAll('.js-plotly-plot .gtitle')].some(t => "
            f"t.textContent.startsWith('gpipe: P={P} M={M + 1}'))", timeout=30_000)
        page.wait_for_timeout(300)
        ex = L.cell(page.evaluate(L.PROBE), "explorer")
        assert ex["plots"][0]["bars"] == boxes(P, M + 1), ex["plots"]
        page.locator(".widget-dropdown", has_text="method").first.locator("select").select_option(
            "1f1b-flush"
        )
        page.wait_for_function(
            "() => [...document.querySelectorAll('.js-plotly-plot .gtitle')].some(t => "
            "t.textContent.startsWith('1f1b-flush: P='))", timeout=30_000)
        summary["slider_and_dropdown"] = "redrawn"

        page.locator(".jp-CodeCell", has_text="# [live]").first.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        page.screenshot(path=str(OUT / "jupyterlab.png"))

        summary["page_errors"] = console[:5]
        browser.close()
    summary["total_s"] = round(time.time() - t_start, 1)
    (OUT / "jupyterlab_summary.json").write_text(json.dumps(summary, indent=1))
    print("\nbrowser check:", json.dumps(summary))


def test_report_renders_offline(chromium: str, tmp_path: Path):
    from playwright.sync_api import sync_playwright

    OUT.mkdir(exist_ok=True)
    root = tmp_path / "nb"
    L.copy_inputs(INPUTS, root)
    env = L.hermetic_env(tmp_path / "home", root)
    executed = root / "report.ipynb"
    bindir = Path(sys.executable).parent
    t0 = time.time()
    # backend=local: the single-process reference executor (this test is about the report, not processes)
    r = subprocess.run(
        [
            str(bindir / "papermill"),
            str(root / NOTEBOOK.name),
            str(executed),
            "-p",
            "backend",
            "local",
            "-p",
            "steps",
            "8",
            "--cwd",
            str(root),
            "-k",
            "python3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([str(bindir / "jupyter"), "nbconvert", "--to", "html", str(executed)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    html = executed.with_suffix(".html")
    size_mb = html.stat().st_size / 1e6
    text = html.read_text(encoding="utf-8")
    # plotly.js is inlined once (offline), not once per figure
    assert text.count("window.PlotlyConfig") == 1, "plotly.js must be inlined exactly once"
    shutil.copy(html, OUT / "report.html")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=L.CHROMIUM_ARGS)
        ctx = browser.new_context(offline=True, viewport={"width": 1300, "height": 1000})
        page = ctx.new_page()
        page.goto(html.as_uri(), wait_until="load", timeout=120_000)
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 6",
                               timeout=60_000)
        page.wait_for_timeout(500)
        rep = page.evaluate(L.REPORT_PROBE)
        page.screenshot(path=str(OUT / "report.png"))
        # plotly's drawing time of the 64x512 Gantt alone: plot its data again into a fresh div
        render_s = page.evaluate("""async () => {
            const gd = [...document.querySelectorAll('.js-plotly-plot')]
                .find(p => ((p.querySelector('.gtitle') || {}).textContent || '').startsWith('big'));
            const div = document.createElement('div'); document.body.appendChild(div);
            const t = performance.now();
            await Plotly.newPlot(div, gd.data, gd.layout);
            const dt = performance.now() - t;
            return div.querySelectorAll('.heatmaplayer image').length ? dt / 1e3 : -1; }""")
        browser.close()
    plots = rep["plots"]
    by_title = {p["title"].split(" —")[0]: p for p in plots}
    assert by_title["schedule"]["bars"] == boxes(P, M)
    assert by_title[f"gpipe: P={P} M={M}"]["bars"] == boxes(P, M)
    live_boxes = int(number(rep["text"], "LIVE_BOXES"))
    assert by_title["live job"]["bars"] == live_boxes > 0
    assert by_title["big"]["images"] >= 1
    assert "Error displaying widget" not in rep["text"] and "Traceback" not in rep["text"]
    assert render_s > 0, "the 64x512 Gantt did not draw again"
    print(f"\nreport: {len(plots)} figures, {size_mb:.1f} MB HTML, papermill+nbconvert+check "
          f"{time.time() - t0:.1f} s; 64x512 Gantt: Plotly.newPlot {render_s:.2f} s in Chromium")

"""The quickstart as a new user meets it: JupyterLab in headless Chromium, Run All, nothing edited.

The stored ``notebooks/01_quickstart.ipynb`` (default parameters: 2 gloo worker processes) is opened in
a private JupyterLab (:mod:`labdriver`) and run with Run > Run All Cells. We check in the DOM that
every cell finished without an error, a widget error or a warning (nothing on stderr, no "Warning" in
any output), that the partition graph and both Gantt charts are drawn, that the live Gantt showed at
least one intermediate state while the job ran (a chart with its status line at a step between the
first and the last), and that every Gantt legend entry is a colour the chart draws: each microbatch's
swatch is a colour of its boxes (or, on a raster chart, of its image's pixels), and every drawn colour
is a legend colour under one of the kinds' shadings. A screenshot goes to ``tests/browser/out/``.
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
LIVE, SIM, MEASURED = 6, 5, 7          # code-cell indices of the live, simulated and measured Gantt
#: most minibatches a long run's first window may show: the warm-up (one with M >= P), three steady
#: ones (pipelab.views.gantt.STEADY_MINIBATCHES) and the ones in flight at the window's edges
WINDOW_MINIBATCHES_MAX = 7

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(480)]

# Every 100 ms: the live cell's status line (the widget's <code>), its drawn boxes and heatmap images.
LIVE_SAMPLER = r"""(index) => {
  window.__live = [];
  if (window.__liveTimer) clearInterval(window.__liveTimer);
  window.__liveTimer = setInterval(() => {
    const c = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[index];
    if (!c) return;
    const code = c.querySelector('.jp-OutputArea code');
    const bars = [...c.querySelectorAll('.js-plotly-plot .barlayer .point path')]
      .filter(x => x.getAttribute('d') !== 'M0,0Z').length;
    window.__live.push({t: performance.now(), status: code ? code.textContent : '', bars,
                        images: c.querySelectorAll('.js-plotly-plot .heatmaplayer image').length});
  }, 100);
}"""

# The legend swatches of each Gantt in a cell and the colours its boxes and heatmap pixels are drawn in.
COLOURS = r"""async (index) => {
  const c = document.querySelectorAll('.jp-Notebook .jp-CodeCell')[index];
  const out = [];
  for (const plot of c.querySelectorAll('.js-plotly-plot')) {
    const legend = [...plot.querySelectorAll('.legend .traces')].map(t => ({
      text: (t.querySelector('.legendtext') || {}).textContent || '',
      fill: getComputedStyle(t.querySelector('.legendpoints path')).fill}));
    const bars = [...new Set([...plot.querySelectorAll('.barlayer .point path')]
      .filter(x => x.getAttribute('d') !== 'M0,0Z').map(x => getComputedStyle(x).fill))];
    const pixels = new Set();
    for (const img of plot.querySelectorAll('.heatmaplayer image')) {
      const src = img.getAttribute('href') || img.getAttribute('xlink:href');
      const im = new Image();
      await new Promise(ok => { im.onload = ok; im.src = src; });
      const cv = document.createElement('canvas');
      cv.width = im.naturalWidth; cv.height = im.naturalHeight;
      const ctx = cv.getContext('2d');
      ctx.drawImage(im, 0, 0);
      const d = ctx.getImageData(0, 0, cv.width, cv.height).data;
      for (let i = 0; i < d.length; i += 4)
        if (d[i + 3] === 255) pixels.add(`rgb(${d[i]}, ${d[i+1]}, ${d[i+2]})`);
    }
    out.push({legend, bars, pixels: [...pixels]});
  }
  return out;
}"""


def defaults() -> dict[str, Any]:
    """The quickstart's parameters as stored (what a new user runs)."""
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    cell = next(c for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    values: dict[str, Any] = {}
    exec("".join(cell["source"]), {}, values)  # the cell is plain assignments of literals
    return values


def rgb(text: str) -> tuple[int, int, int]:
    r, g, b = (int(v) for v in re.findall(r"\d+", text)[:3])
    return r, g, b


def shadings(colour: tuple[int, int, int]) -> list[tuple[int, int, int]]:
    """A legend colour as the raster paints each kind: F as is, B 35% toward black, W 50% toward white."""
    dark = tuple(round(c * 0.65) for c in colour)
    light = tuple(round(c + (255 - c) * 0.5) for c in colour)
    return [colour, dark, light, (0, 0, 0)]  # type: ignore[list-item]


def near(a: tuple[int, int, int], bs: list[tuple[int, int, int]], tol: int = 3) -> bool:
    return any(max(abs(x - y) for x, y in zip(a, b)) <= tol for b in bs)


def check_legend(plot: dict[str, Any], where: str) -> int:
    """Every microbatch swatch is a drawn colour, every drawn colour a legend colour; returns the swatches."""
    swatches = [rgb(e["fill"]) for e in plot["legend"] if e["text"].startswith("microbatch")]
    assert swatches, f"{where}: no colour entries in the legend {plot['legend']}"
    solid = [rgb(f) for f in plot["bars"] if f.startswith("rgb")]
    drawn = solid + [rgb(p) for p in plot["pixels"]]
    grey = (127, 127, 127)                                          # transfers
    allowed = [s for c in swatches for s in shadings(c)] + [grey]
    stray = [c for c in drawn if not near(c, allowed)]
    # a chart with more microbatches than legend entries repeats the palette: only the shown ones are named
    n_keys = max((int(m.group(1)) for e in plot["legend"]
                  if (m := re.search(r"\+(\d+) more", e["text"]))), default=0)
    assert not stray or n_keys, f"{where}: colours drawn that no legend entry names: {stray[:5]}"
    missing = [c for c in swatches if not near(c, drawn)]
    # a raster samples each time bin at its centre: a periodic run's short forwards can fall between
    # the centres of every bin, so there only most of the colours must show
    assert len(missing) <= (len(swatches) // 2 if plot["pixels"] else 0), \
        f"{where}: legend colours not drawn: {missing}"
    return len(swatches)


def test_quickstart_runs_unedited_in_jupyterlab(chromium: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    p = defaults()
    assert p["backend"] == "gloo", "the quickstart must default to real processes"
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

        page.evaluate(LIVE_SAMPLER, LIVE)
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        t0 = time.time()
        while True:
            s = page.evaluate(L.PROBE)
            cells = s["cells"]
            if all(L.finished(c["prompt"]) for c in cells) and lab.kernel_state() == "idle":
                break
            assert s["errors"] == 0, "a cell failed:\n" + "\n".join(c["text"][-1500:] for c in cells
                                                                   if "Error" in c["text"])
            assert time.time() - t0 < 360, f"Run All did not finish: prompts {[c['prompt'] for c in cells]}"
            page.wait_for_timeout(300)
        run_all_s = time.time() - t0
        page.wait_for_timeout(1500)                                  # the last redraws
        s = page.evaluate(L.PROBE)
        cells = s["cells"]
        samples = page.evaluate("window.__live")
        stderr = page.evaluate("""() => document.querySelectorAll(
            '.jp-Notebook [data-mime-type="application/vnd.jupyter.stderr"]').length""")
        colours = {i: page.evaluate(COLOURS, i) for i in (SIM, LIVE, MEASURED)}
        geometry = page.evaluate(L.GEOMETRY)

        assert s["errors"] == 0 and s["widget_errors"] == 0, \
            f"{s['errors']} errors, {s['widget_errors']} widget errors:\n" + \
            "\n".join(c["text"][-1500:] for c in cells if "Error" in c["text"])
        warned = [c["text"][-800:] for c in cells if "Warning" in c["text"]]
        assert stderr == 0 and not warned, "a cell printed a warning:\n" + "\n".join(warned)
        assert len(cells) == 9, f"expected the quickstart's 9 code cells, found {len(cells)}"
        assert "calibrated on" in cells[3]["text"], "the calibration cell did not describe the machine"
        partition, simulated, live, measured, losses = (cells[i] for i in (4, 5, 6, 7, 8))
        assert partition["plots"] and "straight" in partition["text"], "the partition graph was not drawn"
        assert "assumes M=4 microbatches of 16 samples" in simulated["text"], simulated["text"][-500:]
        for name, c in (("simulated", simulated), ("live", live), ("measured", measured)):
            assert c["plots"] and (c["plots"][0]["bars"] or c["plots"][0]["images"]), f"no {name} Gantt"
        assert re.search(r"error [+-]\d+\.\d% \([+-]\d+\.\d% \.\. [+-]\d+\.\d% over 5 rounds\)",
                         measured["text"]), measured["text"][-600:]
        assert losses["plots"], "the loss curve was not drawn"

        # the live chart while the job ran: drawn, with its status line at a step before the last
        running = [x for x in samples if (x["bars"] or x["images"]) and "finished" not in x["status"]]
        steps_seen = sorted({int(m.group(1)) for x in running if (m := re.match(r"step (\d+)", x["status"]))})
        middle = [k for k in steps_seen if 0 < k < p["steps"]]
        final = samples[-1]["status"] if samples else ""
        assert middle, f"no intermediate live Gantt: steps seen while running {steps_seen}, final {final!r}"
        assert final.startswith(f"step {p['steps']}") and "finished" in final, final

        swatches = {i: [check_legend(plot, f"cell {i} plot {j}") for j, plot in enumerate(colours[i])
                        if plot["legend"]] for i in (SIM, MEASURED, LIVE)}
        assert all(swatches.values()), f"a Gantt without a legend: {swatches}"

        # legends clear of titles and bars; a run of `steps` minibatches opens on a few of them
        windows = {}
        for i in (SIM, LIVE, MEASURED):
            for j, plot in enumerate(geometry[i]):
                L.check_legend_clear(plot, f"cell {i} plot {j}")
                if plot["slider"]:
                    shown = {m // p["microbatches"] for m in plot["microbatches"]}
                    windows[i] = len(shown)
                    assert 1 < len(shown) <= WINDOW_MINIBATCHES_MAX, \
                        f"cell {i}: the first window shows minibatches {sorted(shown)} of {p['steps']}"
        assert SIM in windows and MEASURED in windows, f"no range slider on the long runs' charts: {windows}"

        live_cell = page.locator(".jp-CodeCell").nth(LIVE)
        live_cell.scroll_into_view_if_needed()
        page.wait_for_timeout(300)
        page.screenshot(path=str(OUT / "quickstart.png"))
        browser.close()
    print(f"\nquickstart in JupyterLab: Run All {run_all_s:.1f} s (total {time.time() - t_start:.1f} s); "
          f"live Gantt drawn at steps {middle[:10]} before the end; legend colours {swatches}; "
          f"first windows (minibatches) {windows}; "
          f"page errors {page_errors[:3]}")

"""How fast Gantt charts build in Python and draw in a browser: bars vs shapes vs raster (no asserts).

For 1F1B-flush schedules of growing size (P workers x M microbatches, 2PM + P actions) it prints the
median seconds to build the figure in Python, its JSON size, and the median seconds plotly.js takes to
draw it (``Plotly.newPlot``) in headless Chromium, for three ways of drawing the boxes:

* ``bars``   one ``go.Bar`` per action kind (what :func:`pipelab.views.gantt` draws up to ``BARS_MAX``);
* ``shapes`` one layout rectangle per action (the other common way, for comparison);
* ``raster`` one heatmap image on a time grid (what ``gantt`` draws above ``BARS_MAX``).

Run: ``python reproductions/benchmarks/gantt_render.py [--runs N] [--max-svg N]``. The browser column
is skipped when Chromium is missing (``tests/browser/ensure_chromium.sh`` installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import plotly
import plotly.graph_objects as go

from pipelab import schedules
from pipelab.views import gantt, schedule_trace
from pipelab.views.gantt import PALETTE

CHROMIUM = next((c for c in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser")
                 if c and os.access(c, os.X_OK)), None)
SIZES = [(4, 32), (16, 64), (16, 128), (64, 512)]


def shapes_figure(trace) -> go.Figure:
    """The same chart with one layout rectangle per action (no hover): the alternative to bars."""
    rows = {w: i for i, w in enumerate(trace.workers)}
    shapes = [{"type": "rect", "x0": e.start_s, "x1": e.end_s, "y0": rows[e.worker] - 0.4,
               "y1": rows[e.worker] + 0.4, "fillcolor": PALETTE[e.microbatch % len(PALETTE)],
               "line": {"width": 0.5}} for e in trace.compute_events()]
    fig = go.Figure(go.Scatter(x=[0, trace.makespan], y=[0, len(rows) - 1], mode="markers", opacity=0))
    fig.update_layout(shapes=shapes, yaxis={"autorange": "reversed"})
    return fig


def median_time(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-svg", type=int, default=5000, help="largest action count drawn as bars/shapes")
    a = ap.parse_args()

    cases = []
    for P, M in SIZES:
        sched = schedules.build("1f1b-flush", P, microbatches=M)
        trace = schedule_trace(sched)
        n = len(sched)
        builders = {"raster": lambda t=trace: gantt(t, render="raster")}
        if n <= a.max_svg:
            builders["bars"] = lambda t=trace: gantt(t, render="bars")
            builders["shapes"] = lambda t=trace: shapes_figure(t)
        for mode, build in builders.items():
            py_s = median_time(build, a.runs)
            fig_json = build().to_json()
            cases.append({"P": P, "M": M, "actions": n, "mode": mode, "python_s": py_s,
                          "json_mb": len(fig_json) / 1e6, "json": fig_json})

    if CHROMIUM:
        from playwright.sync_api import sync_playwright

        plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_content("<html><body></body></html>")
            page.add_script_tag(path=str(plotly_js))
            for c in cases:
                times = []
                for _ in range(a.runs):
                    times.append(
                        page.evaluate(
                            """async (spec) => {
                        const fig = JSON.parse(spec); const div = document.createElement('div');
                        document.body.appendChild(div);
                        const t = performance.now();
                        await Plotly.newPlot(div, fig.data, fig.layout);
                        const dt = performance.now() - t; Plotly.purge(div); div.remove(); return dt / 1e3; }""",
                            c["json"],
                        )
                    )
                c["browser_s"] = statistics.median(times)
            browser.close()

    print(f"{'P x M':>9} {'actions':>8} {'mode':>7} {'python s':>9} {'JSON MB':>8} {'browser s':>10}")
    for c in cases:
        b = f"{c['browser_s']:10.2f}" if "browser_s" in c else f"{'(no chromium)':>10}"
        print(
            f"{c['P']:>4} x {c['M']:<4}{c['actions']:>8} {c['mode']:>7} {c['python_s']:9.2f} "
            f"{c['json_mb']:8.2f} {b}"
        )
    print(json.dumps([{k: v for k, v in c.items() if k != "json"} for c in cases]))


if __name__ == "__main__":
    main()

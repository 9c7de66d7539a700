"""Write ``widgets_check.ipynb``: the notebook the browser test and the report test run.

Run ``python tests/browser/make_notebook.py`` after editing; the test checks the stored notebook is
what this script writes. Each cell starts with a ``# [name]`` line the browser test finds it by.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat as nbf

HERE = Path(__file__).resolve().parent
NOTEBOOK = HERE / "widgets_check.ipynb"

CELLS = [
    (
        """# [parameters] papermill overrides these
stages = 4
microbatches = 8
steps = 20
backend = "gloo"            # the live job: 2 worker processes; "local" = single-process reference
big_workers = 64
big_microbatches = 512""",
        ["parameters"],
    ),
    (
        """# [setup]
import time
import pipelab as pl
from pipelab import views, widgets
from IPython.display import display
print("live front end:", widgets.live_frontend())""",
        [],
    ),
    (
        """# [gantt] a bare schedule, laid out with unit costs
sched = pl.schedules.build("1f1b-flush", stages, microbatches=microbatches)
fig = views.gantt(sched, title="schedule")
print("GANTT_BOXES", fig.layout.meta["boxes"])
widgets.show(fig)""",
        [],
    ),
    (
        """# [explorer] change the controls: the chart is rebuilt
explorer = widgets.ScheduleExplorer(method="gpipe", stages=stages, microbatches=microbatches)
explorer""",
        [],
    ),
    (
        """# [plans] partition a PipeDream profile for a cluster
prof = pl.Profile.from_pipedream("vgg16")
widgets.PlanExplorer(prof, preset="pipedream-a", servers=2, gpus_per_server=2, method="gpipe")""",
        [],
    ),
    (
        """# [live] a real 2-process job; the chart fills in as its events arrive
import livejob
plan = pl.Plan.from_boundaries(livejob.NUM_LAYERS, [4])
run = pl.launch(livejob.model, plan, method="1f1b-flush", data=livejob.data, loss_fn=livejob.loss_fn,
                optimizer=livejob.sgd, steps=steps, microbatches=4, backend=backend, timeout=240)
live = widgets.LiveGantt(run, title="live job")
display(live)
live.join()
result = run.wait()
drawn = len(result.trace.compute_events()), len(result.trace) - len(result.trace.compute_events())
print("LIVE_BOXES", sum(drawn), "actions", drawn[0], "transfers", drawn[1], "redraws", live.redraws,
      "loss", round(result.losses[-1], 4))""",
        [],
    ),
    (
        """# [big] 64 workers x 512 microbatches
t0 = time.perf_counter()
big = views.gantt(pl.schedules.build("1f1b-flush", big_workers, microbatches=big_microbatches), title="big")
print(f"BIG_BUILD_S {time.perf_counter() - t0:.2f} boxes {big.layout.meta['boxes']} "
      f"render {big.layout.meta['render']}")
widgets.show(big)""",
        [],
    ),
]


def build() -> nbf.NotebookNode:
    """The notebook as an nbformat node (no outputs)."""
    cells = [nbf.v4.new_code_cell(src, metadata={"tags": tags} if tags else {}) for src, tags in CELLS]
    nb = nbf.v4.new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    for i, c in enumerate(nb.cells):       # stable ids so the stored file does not churn
        c["id"] = f"cell-{i}"
    return nb


def text() -> str:
    """The notebook's JSON text, as stored."""
    return nbf.writes(build()) + "\n"


if __name__ == "__main__":
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else NOTEBOOK
    out.write_text(text(), encoding="utf-8")
    print("wrote", out)

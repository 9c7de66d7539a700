"""The live trace's own cost: the same training job with and without the notebook's live Gantt chart.

Job: the quickstart's digits CNN (``demo.small_cnn``), 2 gloo worker processes, ``1f1b-flush``,
minibatch 64 in 4 microbatches, SGD with momentum, ``--steps`` minibatches (long enough that a run
lasts seconds, so the live chart redraws many times and its event count grows into the raster
range). Variants, interleaved within each round (ABC ABC ...; the order alternates between rounds)
so a shared machine's drifting load does not favour one:

* ``script``: ``pl.train(..., progress=False)``, events streamed to the parent, no live view;
* ``live``: ``pl.launch`` + :class:`pipelab.widgets.LiveGantt` with ``live=True``: its consumer
  thread appends every event and redraws a ``FigureWidget`` at most ``hz`` times a second exactly
  as in JupyterLab, headless (the widget has no front end here, so what a browser spends drawing is
  not counted; the kernel side is: building the figure and updating the widget's state);
* ``live-unthrottled``: the same with ``cpu_share=1.0``, which is how LiveGantt redrew before its
  redraw budget (at most ``hz`` times a second, whatever a redraw cost): the "before" of the fix;
* ``live-fast`` (``--fast-hz 20``): the same at a higher redraw rate, to show how the cost scales
  with the redraw frequency;
* ``no-stream``: ``pl.train(..., stream=False)``: each worker keeps its events and sends them once,
  at its end, so nothing crosses a process boundary while the job runs.

Figure of merit: samples/s between the first action's start and the last action's end
(``RunResult.throughput``; process start-up excluded alike), medians over ``--rounds``; the overhead
of a variant is ``1 - its median / the script's median``, and, paired, ``1 -`` the geometric mean of
its per-round ratios to the script (:func:`paired_overhead`). Also printed per variant: median redraws
per run, median seconds spent redrawing per run (the consumer thread's time inside ``refresh``),
and the parent's CPU seconds per run (all its threads: the monitor that reads the queue, the live
view's thread).

``--notebook`` also runs ``script`` and ``live`` inside a Jupyter kernel (nbclient; no front end,
so the widget's messages go to nbclient, which keeps them), alternating, and prints the same
figures: the cost of a notebook kernel against a plain script.

    python reproductions/benchmarks/live_trace_cost.py [--steps 200] [--rounds 10] [--fast-hz 20] [--notebook]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.models import demo  # noqa: E402
from pipelab.widgets import LiveGantt  # noqa: E402

BATCH, MICROBATCHES, METHOD = 64, 4, "1f1b-flush"
VARIANTS = ("script", "live", "live-unthrottled", "no-stream")


class TimedLiveGantt(LiveGantt):
    """LiveGantt that also sums the seconds its redraws take (the consumer thread's redraw term)."""

    redraw_s = 0.0

    def refresh(self) -> None:
        """Redraw as LiveGantt does, timing it."""
        t = time.perf_counter()
        super().refresh()
        self.redraw_s += time.perf_counter() - t


def setup() -> dict[str, Any]:
    """Data, a 2-stage plan of the digits CNN partitioned from its profile, and train()'s arguments."""
    images, labels = demo.digits_data("train")
    n = len(labels) // BATCH * BATCH
    data = functools.partial(demo.batches, (images[:n], labels[:n]), BATCH)
    prof = pl.profile(demo.small_cnn(), data()[0][0], progress=False, small_batch=BATCH // MICROBATCHES)
    plan = pl.partition(prof, pl.Cluster.flat(2, bandwidth=1e9), method="pipedream", straight=True)
    return {"model_fn": demo.small_cnn, "plan": plan, "method": METHOD, "data": data,
            "microbatches": MICROBATCHES, "loss_fn": torch.nn.functional.cross_entropy, "backend": "gloo",
            "optimizer": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def sample(variant: str, kwargs: dict[str, Any], steps: int, hz: float = 4.0,
           fast_hz: float = 20.0) -> dict[str, float]:
    """Run the job once as ``variant``; its samples/s, redraws, redraw seconds, parent CPU seconds."""
    cpu = _cpu()
    redraws, redraw_s, redraw_cpu = 0, 0.0, 0.0
    if variant in ("script", "no-stream"):
        run = pl.train(steps=steps, progress=False, stream=variant == "script", **kwargs)
    elif variant in ("live", "live-unthrottled", "live-fast"):
        handle = pl.launch(steps=steps, **kwargs)
        view = TimedLiveGantt(handle, live=True, hz=fast_hz if variant == "live-fast" else hz,
                              cpu_share=1.0 if variant == "live-unthrottled" else 0.02)
        run = handle.wait()
        if not view.join(120):
            raise RuntimeError("the live view did not finish its last redraw within 120 s")
        redraws, redraw_s, redraw_cpu = view.redraws, view.redraw_s, view.redraw_cpu_s
    else:
        raise ValueError(f"unknown variant {variant!r}; use one of {VARIANTS + ('live-fast',)}")
    events = len(run.trace.events)
    return {"samples_per_s": run.throughput, "span_s": run.trace.makespan, "redraws": redraws,
            "redraw_s": redraw_s, "redraw_cpu_s": redraw_cpu, "parent_cpu_s": _cpu() - cpu, "events": events}


def rounds(variants: tuple[str, ...], kwargs: dict[str, Any], steps: int, n: int, hz: float,
           fast_hz: float = 20.0) -> dict[str, list[dict[str, float]]]:
    """``n`` rounds, each running every variant once, in an order that alternates between rounds."""
    out: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for v in variants:        # warm the fork server and the imports (ipywidgets, anywidget) of each path
        sample(v, kwargs, max(steps // 10, 4), hz, fast_hz)
    for r in range(n):
        for v in (variants if r % 2 == 0 else variants[::-1]):
            out[v].append(sample(v, kwargs, steps, hz, fast_hz))
            print(f"  round {r}: {v:18s} {out[v][-1]['samples_per_s']:8.0f} samples/s", file=sys.stderr)
    return out


def paired_overhead(variant: list[dict[str, float]], base: list[dict[str, float]]) -> float:
    """``1 -`` the geometric mean of the per-round ratios ``variant / base``, the rounds run in each
    order weighted equally (on this machine a run's position in a round moves it by tens of per cent,
    so the two orders' means are averaged, not pooled)."""
    logs: dict[int, list[float]] = {0: [], 1: []}
    for r, (a, b) in enumerate(zip(variant, base, strict=True)):
        logs[r % 2].append(math.log(a["samples_per_s"] / b["samples_per_s"]))
    means = [statistics.fmean(v) for v in logs.values() if v]
    return 1 - math.exp(statistics.fmean(means))


def report(title: str, res: dict[str, list[dict[str, float]]], base: str = "script") -> None:
    """Print the medians per variant and the overhead against ``base``: ``1 - ratio`` of the medians,
    and :func:`paired_overhead` (each variant against ``base`` of the same round)."""
    med = {v: {k: statistics.median(s[k] for s in samples) for k in samples[0]} for v, samples in res.items()}
    ref = med[base]["samples_per_s"]
    print(f"\n{title} (medians of {len(res[base])} runs, {int(med[base]['events'])} events per run)")
    print(f"{'variant':18s} {'samples/s':>10s} {'overhead':>9s} {'paired':>7s} {'span s':>7s} "
          f"{'redraws':>8s} {'redraw s':>9s} {'redraw CPU s':>13s} {'parent CPU s':>13s}")
    for v, m in med.items():
        print(f"{v:18s} {m['samples_per_s']:10.0f} {1 - m['samples_per_s'] / ref:+9.1%} "
              f"{paired_overhead(res[v], res[base]):+7.1%} {m['span_s']:7.2f} {m['redraws']:8.0f} "
              f"{m['redraw_s']:9.2f} {m['redraw_cpu_s']:13.2f} {m['parent_cpu_s']:13.2f}")
    for v, samples in res.items():
        per_round = " ".join(f"{s['samples_per_s']:.0f}" for s in samples)
        print(f"  {v:18s} per round: {per_round}")


NOTEBOOK_CELL = """
import sys, json
sys.path.insert(0, {here!r})
import live_trace_cost as b
kwargs = b.setup()
res = b.rounds(("script", "live"), kwargs, {steps}, {rounds}, {hz})
print("RESULT" + json.dumps(res))
"""


def in_notebook(steps: int, n: int, hz: float) -> dict[str, list[dict[str, float]]]:
    """The ``script`` and ``live`` rounds run inside a Jupyter kernel (nbclient), their samples."""
    import nbclient
    import nbformat

    here = str(Path(__file__).resolve().parent)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        NOTEBOOK_CELL.format(here=here, steps=steps, rounds=n, hz=hz))])
    nbclient.NotebookClient(nb, timeout=1800, kernel_name="python3").execute()
    text = "".join(o.get("text", "") for o in nb.cells[0].outputs if o.get("name") == "stdout")
    line = next(ln for ln in text.splitlines() if ln.startswith("RESULT"))
    return dict(json.loads(line[len("RESULT"):]))


def main() -> None:
    """Parse options, run the rounds, print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="minibatches per run (default 200)")
    ap.add_argument("--rounds", type=int, default=10, help="rounds of every variant (default 10)")
    ap.add_argument("--hz", type=float, default=4.0, help="the live view's redraws per second (default 4)")
    ap.add_argument("--fast-hz", type=float, default=0.0,
                    help="also a live view redrawing this often (e.g. 20; default: not run)")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated, 'script' first (default {','.join(VARIANTS)})")
    ap.add_argument("--notebook", action="store_true", help="also script and live inside a Jupyter kernel")
    args = ap.parse_args()
    if args.rounds < 2 or args.steps < 4 or args.hz <= 0 or args.fast_hz < 0:
        ap.error("--rounds must be >= 2, --steps >= 4, --hz > 0 and --fast-hz >= 0")
    kwargs = setup()
    variants = tuple(args.variants.split(",")) + (("live-fast",) if args.fast_hz > 0 else ())
    known = VARIANTS + ("live-fast",)
    if variants[0] != "script" or not set(variants) <= set(known):
        ap.error(f"--variants {args.variants!r}: 'script' first, then any of {known}")
    res = rounds(variants, kwargs, args.steps, args.rounds, args.hz, args.fast_hz)
    report(f"script ({METHOD}, 2 gloo workers, {args.steps} minibatches of {BATCH}, hz={args.hz})", res)
    if args.notebook:
        report("inside a Jupyter kernel (nbclient)", in_notebook(args.steps, args.rounds, args.hz))


if __name__ == "__main__":
    main()

"""Seconds for a fault to surface, orphans left, and what the checkpoint folder holds afterwards.

Faults injected into real runs (3 gloo workers, 1F1B-flush, a 9-layer MLP, checkpoint every step):
a worker that raises, a worker SIGKILLed, a NaN loss, and the launcher itself SIGKILLed (a script
that launched the run). For each: the seconds from the fault to the ``WorkerError`` (to the last
worker gone, for a killed launcher), the worker processes still alive 1 s later, and whether the
newest sealed checkpoint loads with finite weights. Medians and ranges over ``--rounds``.

    .venv/bin/python reproductions/benchmarks/fault_surface.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _faults as FX  # noqa: E402
import torch  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.runtime import WorkerError  # noqa: E402
from pipelab.runtime import checkpoint_files as ck  # noqa: E402

PLAN = pl.Plan.from_boundaries(9, [3, 6])


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def finite_latest(root: Path) -> str:
    last = ck.latest(root)
    if last is None:
        return "no checkpoint"
    for r in range(3):
        st = ck.load_worker(last, r, plan=PLAN, method="1f1b-flush")
        for s in st["stages"].values():
            if not all(torch.isfinite(v).all() for v in s["module"].values()):
                return f"{last.name} NON-FINITE"
    return f"{last.name} loads, finite"


#: where the workers stamp the time of their fault (set before the fork server starts: it keeps its
#: environment; worker processes re-import this module and keep the launcher's)
if "PIPELAB_FAULT_CLOCK" not in os.environ:
    os.environ["PIPELAB_FAULT_CLOCK"] = str(Path(tempfile.mkdtemp(prefix="pipelab-faults-")) / "clock")
CLOCK = Path(os.environ["PIPELAB_FAULT_CLOCK"])


def in_process(kind: str, tmp: Path) -> tuple[float, int, str]:
    clock = CLOCK
    clock.unlink(missing_ok=True)
    loss = {"raise": FX.raising_loss, "nan": FX.nan_loss}.get(kind, torch.nn.functional.cross_entropy)
    run = pl.launch(FX.mlp, PLAN, method="1f1b-flush", data=FX.data, loss_fn=loss, optimizer=FX.sgd,
                    steps=300, microbatches=4, timeout=120, checkpoint_every=1, checkpoint_dir=tmp / "ck")
    pids = run.pids
    if kind == "kill":
        evs = iter(run.events)
        while sum(e.kind == "U" for e in run.events_so_far()) < 3 * FX.FAULT_STEP:
            next(evs)
        t_fault = time.time()
        os.kill(pids[1], signal.SIGKILL)
    try:
        run.wait()
        raise AssertionError("the run did not fail")
    except WorkerError:
        t_seen = time.time()
    if kind != "kill":
        t_fault = float(clock.read_text())
    time.sleep(1.0)
    return t_seen - t_fault, sum(alive(p) for p in pids), finite_latest(tmp / "ck")


LAUNCHER = """
import json, sys, time
sys.path[:0] = [{here!r}]
import _faults as FX, pipelab as pl
run = pl.launch(FX.mlp, pl.Plan.from_boundaries(9, [3, 6]), method="1f1b-flush", data=FX.data,
                loss_fn=__import__("torch").nn.functional.cross_entropy, optimizer=FX.sgd, steps=300,
                microbatches=4, timeout=200, checkpoint_every=1, checkpoint_dir={ck!r})
evs = iter(run.events)
while sum(e.kind == "U" for e in run.events_so_far()) < 3 * 6:
    next(evs)
print(json.dumps(run.pids), flush=True)
time.sleep(600)
"""


def killed_launcher(tmp: Path) -> tuple[float, int, str]:
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER.format(here=str(HERE), ck=str(tmp / "ck"))],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = json.loads(proc.stdout.readline())
    t0 = time.time()
    proc.kill()
    proc.wait()
    while any(alive(p) for p in pids) and time.time() - t0 < 30:
        time.sleep(0.01)
    gone = time.time() - t0
    steps = sorted(p.name for p in (tmp / "ck").glob("step-*"))
    time.sleep(1.0)
    left = sum(alive(p) for p in pids)
    for p in pids:
        if alive(p):
            os.kill(p, signal.SIGKILL)
    later = sorted(p.name for p in (tmp / "ck").glob("step-*"))
    return gone, left, finite_latest(tmp / "ck") + ("" if later == steps else "; NEW STEPS after the kill")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    rows: dict[str, list[tuple[float, int, str]]] = {}
    for _ in range(a.rounds):     # interleaved rounds
        for kind in ("raise", "kill", "nan", "launcher"):
            with tempfile.TemporaryDirectory() as d:
                r = killed_launcher(Path(d)) if kind == "launcher" else in_process(kind, Path(d))
            rows.setdefault(kind, []).append(r)
    names = {"raise": "a worker raises", "kill": "a worker is SIGKILLed", "nan": "a NaN loss",
             "launcher": "the launcher is SIGKILLed (until every worker is gone)"}
    print(f"{'fault':56} {'seconds to surface: median (min-max)':38} orphans  newest checkpoint")
    for kind, rs in rows.items():
        s = [x[0] for x in rs]
        print(f"{names[kind]:56} {statistics.median(s):8.3f} ({min(s):.3f}-{max(s):.3f}){'':14} "
              f"{max(x[1] for x in rs):7d}  {'; '.join(sorted({x[2] for x in rs}))}")


if __name__ == "__main__":
    main()

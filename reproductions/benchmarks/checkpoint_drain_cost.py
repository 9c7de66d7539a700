"""The price of exact checkpoints for asynchronous methods: one pipeline fill and drain per N minibatches.

With ``checkpoint_every=N`` an asynchronous schedule is built as drained segments of N minibatches
(:mod:`pipelab.schedules.segments`). This prints, for a straight P-stage pipeline:

* simulated (unit costs F = 1, B = 2, no transfers): the makespan of K minibatches without drains and
  drained every N, their ratio, and the closed form of the extra time, ``(K/N - 1)(P - 1)(f + b)``;
* measured (reference executor and 2 gloo processes, CPU, a small MLP, median of ``--repeats``
  runs): wall seconds of ``pipedream`` for K minibatches without checkpoints and with
  ``checkpoint_every=N`` (drains plus the checkpoint writes), and their ratio.

Run: ``python reproductions/benchmarks/checkpoint_drain_cost.py [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from pipelab import schedules  # noqa: E402
from pipelab.partition.plan import Plan  # noqa: E402
from pipelab.runtime import train  # noqa: E402
from pipelab.schedules.dataflow import UnitCosts  # noqa: E402
from pipelab.sim import simulate_schedule  # noqa: E402


def model() -> nn.Module:
    """4 x (Linear(256, 256) + ReLU): one block per stage."""
    torch.manual_seed(0)
    return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.ReLU())])


def data() -> object:
    """32 fixed minibatches of 32 rows (deterministic)."""
    g = torch.Generator().manual_seed(1)
    for _ in range(32):
        yield torch.randn(32, 256, generator=g), torch.randn(32, 256, generator=g)


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error."""
    return nn.functional.mse_loss(out, y)


def sgd(params: object) -> torch.optim.Optimizer:
    """SGD with momentum."""
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)  # type: ignore[arg-type]


def simulated() -> None:
    print("simulated, unit costs (F=1, B=2), straight pipeline")
    print(f"{'method':<12}{'P':>3}{'K':>5}{'N':>4}{'plain':>9}{'drained':>9}{'ratio':>8}{'extra':>7}{'closed':>8}")
    for method in ("pipedream", "2bw", "pipemare"):
        for P, K, N in ((4, 64, 8), (4, 64, 32), (8, 64, 16)):
            a = schedules.build(method, P, minibatches=K)
            b = schedules.build(method, P, minibatches=K, drain_every=N)
            ta, tb = simulate_schedule(a, UnitCosts()).makespan, simulate_schedule(b, UnitCosts()).makespan
            closed = (K // N - 1) * (P - 1) * 3.0
            print(
                f"{method:<12}{P:>3}{K:>5}{N:>4}{ta:>9.0f}{tb:>9.0f}"
                f"{tb / ta:>8.3f}{tb - ta:>7.0f}{closed:>8.0f}"
            )


def measured(repeats: int) -> None:
    plan = Plan.from_boundaries(8, [4])
    K, N = 32, 8
    print(f"\nmeasured: pipedream, 2 stages, K={K} minibatches, checkpoint_every={N}, median of {repeats}")
    for backend in ("local", "gloo"):
        times: dict[str, list[float]] = {"plain": [], "checkpointed": []}
        for _ in range(repeats):
            for name in times:
                with tempfile.TemporaryDirectory() as d:
                    kw = {"checkpoint_every": N, "checkpoint_dir": d} if name == "checkpointed" else {}
                    t = time.perf_counter()
                    train(model, plan, method="pipedream", data=data, loss_fn=loss_fn, optimizer=sgd, steps=K,
                          backend=backend, progress=False, **kw)
                    times[name].append(time.perf_counter() - t)
        p, c = statistics.median(times["plain"]), statistics.median(times["checkpointed"])
        print(f"  {backend:<6} plain {p:.3f} s  checkpointed {c:.3f} s  ratio {c / p:.3f}")


def main() -> None:
    """Print the simulated and measured figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    simulated()
    measured(args.repeats)


if __name__ == "__main__":
    main()

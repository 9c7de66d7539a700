"""How well per-layer timings add up: sum of the profiler's layer forward (and backward) times
against the whole model's measured forward (and forward+backward) time, on this machine's CPU.

    OMP_NUM_THREADS=1 .venv/bin/python reproductions/benchmarks/profiler_accuracy.py

Prints, per model, medians over runs and the ratio sum(layers) / whole model (1.00 = exact).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402

import pipelab as pl  # noqa: E402
from pipelab.models import example  # noqa: E402


def whole_model(
    model: torch.nn.Module, sample: tuple[torch.Tensor, ...], runs: int = 7
) -> tuple[float, float]:
    """Median forward seconds and median forward+backward seconds of the whole model."""
    fwd, step = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = model(*sample)
        t1 = time.perf_counter()
        out.float().sum().backward()
        t2 = time.perf_counter()
        fwd.append(t1 - t0)
        step.append(t2 - t0)
    return statistics.median(fwd), statistics.median(step)


def main() -> None:
    torch.manual_seed(0)
    cases = [("mlp", 256, {}), ("small_cnn", 256, {}), ("resnet50", 8, {"image_size": 64}),
             ("vgg16", 4, {"image_size": 64}), ("gnmt8", 8, {"vocab": 1000, "hidden": 256, "seq_len": 16}),
             ("tiny_transformer", 32, {"seq_len": 32})]
    print(f"{'model':<18}{'layers':>7}{'sum fwd ms':>12}{'whole fwd ms':>14}{'ratio':>7}"
          f"{'sum f+b ms':>12}{'whole f+b ms':>14}{'ratio':>7}")
    for name, batch, kw in cases:
        model, sample = example(name, batch, **kw)
        model.eval() if name == "gnmt8" else model.train()  # dropout off for GNMT: same work each run
        whole_model(model, sample, runs=2)  # warm-up
        f, fb = whole_model(model, sample)
        prof = pl.profile(model, sample, repeats=5, progress=False)
        pf, pfb = prof.fwd_s, prof.fwd_s + prof.bwd_s
        print(f"{name:<18}{len(prof):>7}{pf * 1e3:>12.2f}{f * 1e3:>14.2f}{pf / f:>7.2f}"
              f"{pfb * 1e3:>12.2f}{fb * 1e3:>14.2f}{pfb / fb:>7.2f}")


if __name__ == "__main__":
    main()

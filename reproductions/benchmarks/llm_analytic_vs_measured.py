"""The analytic transformer Profile (pipelab.llm) against a measured one, on this CPU.

A small GPT (embedding, blocks, final norm, untied head; fp32) is profiled layer by layer with
``pipelab.profile`` and built analytically with ``transformer_profile`` on this CPU's rates, measured
per operation here: a GEMM probe (the median FLOP/s of ``torch.matmul`` over the model's weight shapes)
and a streaming probe (the median bytes/s of ``x + y`` over 64 MB tensors into a preallocated output).
Prints, per
layer kind, forward and backward milliseconds measured and predicted with their ratio, and the FLOPs
(which ``tests/test_llm.py`` checks exactly). Timings on a busy machine are noisy: medians of
``--repeats`` runs.

Usage: ``OMP_NUM_THREADS=1 PYTHONPATH=. python reproductions/benchmarks/llm_analytic_vs_measured.py``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from pipelab.llm import DeviceRates, Parallel, Transformer, transformer_profile  # noqa: E402
from pipelab.models import PlainBlock, plain_gpt  # noqa: E402
from pipelab.profile.measure import profile  # noqa: E402


def _median_rate(fn: object, work: float, repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        rates.append(work / (time.perf_counter() - t0))
    return statistics.median(rates)


def measure_rates(shape: Transformer, rows: int, repeats: int) -> DeviceRates:
    """This CPU's fp32 GEMM FLOP/s over the model's own weight-matmul shapes (``rows`` tokens: qkv, proj,
    MLP up and down, head; all timed in one pass, median of ``repeats``) and streaming bytes/s (``x + y``
    into a preallocated output), as DeviceRates."""
    mms = [m for m in shape.matmuls(rows) if m.weight]
    pairs = [(torch.randn(m.rows, m.inner), torch.randn(m.inner, m.cols)) for m in mms]
    pairs.append((torch.randn(rows, shape.hidden), torch.randn(shape.hidden, shape.vocab)))
    work = sum(2 * a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs)

    def gemms() -> None:
        for a, b in pairs:
            a @ b

    gemms()                                                   # warm-up
    flops = _median_rate(gemms, work, repeats)
    x, y, z = torch.randn(16 * 2**20), torch.randn(16 * 2**20), torch.empty(16 * 2**20)
    torch.add(x, y, out=z)
    stream = _median_rate(lambda: torch.add(x, y, out=z), 3 * 4 * x.numel(), repeats)
    # links are not used on one CPU: set to the streaming rate
    return DeviceRates(name="cpu-measured", peak_flops_bf16=flops, peak_flops_fp16=flops,
                       peak_flops_fp32=flops, hbm_bytes_per_s=stream, memory_bytes=2**34, gemm_efficiency=1.0,
                       hbm_efficiency=1.0, nvlink_bytes_per_s=stream, nvlink_busbw=stream,
                       nic_bytes_per_s=stream, nic_busbw=stream, nics_per_node=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args()
    torch.manual_seed(0)
    shape = Transformer(name="tiny-gpt", layers=4, hidden=args.hidden, heads=4, seq=128, vocab=2048,
                        tied=False, precision="fp32", positions=False)
    batch = 4
    rates = measure_rates(shape, batch * shape.seq, args.repeats)
    print(f"this CPU: GEMM {rates.peak_flops_fp32 / 1e9:.1f} GFLOP/s (median of {args.repeats}, "
          f"the model's weight-matmul shapes, fp32), streaming {rates.hbm_bytes_per_s / 1e9:.1f} GB/s "
          "(x + y into a preallocated 64 MB output)")
    net = plain_gpt(vocab=shape.vocab, hidden=shape.hidden, heads=shape.heads, layers=shape.layers)
    x = torch.randint(0, shape.vocab, (batch, shape.seq))
    runs = [profile(net, x, progress=False, repeats=3, warmup=1, small_batch=None, leaf_modules=(PlainBlock,))
            for _ in range(args.repeats)]
    analytic = transformer_profile(shape, Parallel(microbatch_size=batch), rates)
    print(f"{'layer':12s} {'fwd ms meas':>11s} {'pred':>7s} {'ratio':>6s} {'bwd ms meas':>11s} {'pred':>7s} "
          f"{'ratio':>6s} {'GFLOP meas':>10s} {'pred':>7s}")
    for i, ly in enumerate(analytic.layers):
        f = statistics.median(r.layers[i].fwd_s for r in runs)
        b = statistics.median(r.layers[i].bwd_s for r in runs)
        lo_f = min(r.layers[i].fwd_s for r in runs)
        hi_f = max(r.layers[i].fwd_s for r in runs)
        print(f"{ly.name:12s} {f * 1e3:11.3f} {ly.fwd_s * 1e3:7.3f} {ly.fwd_s / f:6.2f} {b * 1e3:11.3f} "
              f"{ly.bwd_s * 1e3:7.3f} {ly.bwd_s / b:6.2f} {runs[0].layers[i].flops / 1e9:10.3f} "
              f"{ly.flops / 1e9:7.3f}   (fwd range {lo_f * 1e3:.3f}-{hi_f * 1e3:.3f})")
    tot_m = statistics.median(sum(ly.fwd_s + ly.bwd_s for ly in r.layers) for r in runs)
    tot_p = sum(ly.fwd_s + ly.bwd_s for ly in analytic.layers)
    print(f"total forward+backward: measured {tot_m * 1e3:.2f} ms, predicted {tot_p * 1e3:.2f} ms, "
          f"ratio {tot_p / tot_m:.2f}")


if __name__ == "__main__":
    main()

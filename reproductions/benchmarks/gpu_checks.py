"""The checks a GPU runs, with figures: what ``tests/test_gpu.py`` asserts, plus memory and throughput.

On a machine with CUDA it prints, for the demo CNN on scikit-learn's digits (batch 64):

1. profiling on CUDA: per-layer forward/backward times from CUDA events, their sum against the whole
   model's forward and backward timed alike;
2. the reference executor on CUDA against the CPU: largest weight difference after training
   (float tolerance, not bit equality: the kernels differ);
3. 2 and 4 worker processes sharing the one GPU over gloo (messages staged through host memory),
   a synchronous (``1f1b-flush``, ``gpipe`` with a replicated stage) and an asynchronous
   (``pipedream``) method, both message matchings (by tag, and by order as NCCL matches): largest
   weight difference against the reference executor on the GPU;
4. HetPipe's WSP parameter server with CUDA workers: the same difference;
5. predicted peak memory (:meth:`pipelab.costs.CostModel.memory_bytes`) against
   ``torch.cuda.max_memory_allocated`` of a one-stage GPipe run in this process (one worker, so the
   process's peak is the worker's);
6. simulated against measured throughput of ``1f1b-flush`` over 2 CUDA workers on gloo: the
   simulator gets the CUDA profile, a flat 2-worker cluster of ``--loopback-bandwidth`` and the
   device-host copy speed measured here (``host_staging_bandwidth``). Both workers share one GPU,
   which the simulator does not model (it gives each worker its own device), so the ratio shows
   that contention too;
7. memory of a transformer training step shaped like torchtitan's Llama 3.1 8B run (its blocks,
   vocabulary, sequence 8,192 and local batch 2, 4 of its 32 layers; Hugging Face's Llama, bf16,
   per-operator checkpointing, the logits upcast for the loss): ``pipelab.llm.memory_per_device``
   against ``torch.cuda.max_memory_allocated``, and the caching allocator's peak reserved memory over
   it, with ``expandable_segments`` on (as torchtitan's launcher sets it) and off, each in a fresh
   process (``reproductions/llm_acceptance/measured_step.py --device cuda``).

Without CUDA it says so and measures nothing; ``--dry-run-on-cpu`` runs the same code on the CPU
(CUDA-only figures left out), to check the script itself.

    python reproductions/benchmarks/gpu_checks.py [--steps 6] [--loopback-bandwidth 2e9]
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import functools  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

import pipelab as pl  # noqa: E402
import pipelab.metrics as metrics  # noqa: E402
from pipelab.costs import CostModel  # noqa: E402
from pipelab.models import demo  # noqa: E402

BATCH = 64
LAYERS = 9    # the demo CNN as the layer graph sees it
optimizer = functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9)
loss_fn = torch.nn.functional.cross_entropy


def model_fn() -> torch.nn.Module:
    """The demo CNN."""
    return demo.small_cnn()


def data() -> list[tuple[torch.Tensor, ...]]:
    """Minibatches of 64 digits, the same every call."""
    images, labels = demo.digits_data("train")
    return demo.batches((images[:BATCH * 16], labels[:BATCH * 16]), BATCH, shuffle=False)


def _train(plan: pl.Plan, method: str, backend: str, device: str, steps: int, microbatches: int,
           **kw: Any) -> Any:
    dev = {} if device == "cpu" else {"device": device}
    return pl.train(model_fn, plan, method=method, data=data, loss_fn=loss_fn, optimizer=optimizer,
                    steps=steps, microbatches=microbatches, backend=backend, progress=False, timeout=300,
                    **dev, **kw)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _timed(device: str, fn: Any, repeats: int = 5) -> float:
    """Median seconds of ``fn()``, timed with CUDA events on CUDA."""
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def check_profile(device: str) -> pl.Profile:
    """1. per-layer times (CUDA events on CUDA) against the whole model's."""
    x, y = data()[0]
    prof = pl.profile(model_fn(), x, device=device, warmup=2, repeats=5, progress=False, small_batch=16)
    m = model_fn().to(device)
    xd, yd = x.to(device), y.to(device)
    fwd = _timed(device, lambda: m(xd))

    def fwd_bwd() -> None:
        loss_fn(m(xd), yd).backward()

    both = _timed(device, fwd_bwd)
    f = sum(layer.fwd_s for layer in prof.layers)
    b = sum(layer.bwd_s for layer in prof.layers)
    print(f"1. profile on {prof.device}: {len(prof.layers)} layers, sum of forwards {f * 1e3:.3f} ms against "
          f"the whole forward {fwd * 1e3:.3f} ms ({f / fwd:.2f}x); forward+backward {(f + b) * 1e3:.3f} ms "
          f"against {both * 1e3:.3f} ms ({(f + b) / both:.2f}x)")
    return prof


def check_reference(device: str, steps: int) -> None:
    """2. the reference executor on ``device`` against the CPU."""
    plan = pl.Plan.from_boundaries(LAYERS, [4])
    a = _train(plan, "1f1b-flush", "local", device, steps, 4)
    b = _train(plan, "1f1b-flush", "local", "cpu", steps, 4)
    diff = _max_diff(a.state_dict(), b.state_dict())
    print(f"2. reference executor on {device} vs CPU, 1f1b-flush, {steps} steps: largest weight difference "
          f"{diff:.2e}; final losses {a.losses[-1]:.6f} vs {b.losses[-1]:.6f}")


def check_processes(device: str, steps: int) -> None:
    """3. 2-4 worker processes on one device over gloo against the reference executor there."""
    cases = [("1f1b-flush", pl.Plan.from_boundaries(LAYERS, [4]), 4, steps),
             ("gpipe", pl.Plan.from_boundaries(LAYERS, [3, 5], [2, 1, 1]), 4, steps),
             ("pipedream", pl.Plan.from_boundaries(LAYERS, [3, 5]), 1, 2 * steps)]
    for method, plan, M, k in cases:
        ref = _train(plan, method, "local", device, k, M)
        for match in ("tag", "order"):
            os.environ["PIPELAB_P2P_MATCH"] = match
            t = time.perf_counter()
            run = _train(plan, method, "gloo", device, k, M)
            wall = time.perf_counter() - t
            diff = _max_diff(run.state_dict(), ref.state_dict())
            print(f"3. {plan.num_workers} workers on {device} over gloo ({match} matching), {method}, "
                  f"{k} steps: largest weight difference to the reference executor {diff:.2e} ({wall:.1f} s)")
    os.environ.pop("PIPELAB_P2P_MATCH", None)


def check_wsp(device: str, steps: int) -> None:
    """4. HetPipe's parameter server with workers on ``device``."""
    from pipelab.runtime import param_server as wsp

    plan = pl.Plan.from_boundaries(LAYERS, [4], replicas=[2, 2])
    k = 4 * max(2, steps // 2)
    run = _train(plan, "hetpipe", "gloo", device, k, 1, D=0)
    ref = _train(plan, "hetpipe", "local", device, k, 1, D=0)
    print(f"4. hetpipe (2 virtual workers x 2 stages) on {device}, {k} steps: largest weight difference to "
          f"the reference executor {_max_diff(run.state_dict(), ref.state_dict()):.2e}; staleness seen "
          f"{wsp.check_trace(run.trace, 0)} (bound D=0)")


def check_memory(prof: pl.Profile, steps: int) -> None:
    """5. predicted peak memory of one worker against torch.cuda.max_memory_allocated."""
    M = 4
    plan = pl.Plan.from_boundaries(len(prof.layers), [], [1])
    cm = CostModel(prof, pl.Cluster.flat(1), optimizer="sgd-momentum")
    parts = cm.memory_bytes(0, len(prof.layers), versions=1, in_flight=M, microbatches=M)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    _train(plan, "gpipe", "local", "cuda", steps, M)
    peak = torch.cuda.max_memory_allocated() - base
    predicted = sum(parts.values())
    print(f"5. one-stage gpipe, M={M}: predicted peak {predicted / 2**20:.2f} MiB "
          f"({', '.join(f'{k} {v / 2**20:.2f}' for k, v in parts.items())}); measured "
          f"max_memory_allocated {peak / 2**20:.2f} MiB (measured / predicted {peak / predicted:.2f})")


def host_copy_bandwidth(nbytes: int = 64 * 2**20) -> float:
    """Bytes/s of a device-to-host copy into pageable memory (what DistComm's staging does)."""
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    x.cpu()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        x.cpu()
    torch.cuda.synchronize()
    return 5 * nbytes / (time.perf_counter() - t)


def check_throughput(prof: pl.Profile, device: str, steps: int, loopback: float) -> None:
    """6. simulated against measured throughput, 1f1b-flush over 2 workers on gloo."""
    plan = pl.Plan.from_boundaries(len(prof.layers), [4])
    staging = host_copy_bandwidth() if device.startswith("cuda") else None
    cluster = pl.Cluster.flat(2, bandwidth=loopback)
    sim = pl.simulate(plan, prof, cluster, method="1f1b-flush", microbatches=4, minibatches=steps,
                      allreduce_overlap="none", host_staging_bandwidth=staging)
    run = _train(plan, "1f1b-flush", "gloo", device, steps, 4)
    # steady state: the median interval between minibatch completions after two of warm-up (the first
    # steps pay lazy initialisation: CUDA context, cuBLAS handles, allocator growth)
    done = metrics.minibatch_completions(run.trace.events, 4, steps)
    period = statistics.median(b - a for a, b in zip(done[2:], done[3:])) if len(done) > 3 else None
    measured = BATCH / period if period else run.throughput
    where = f"device-host copies at {staging / 1e9:.1f} GB/s, " if staging else ""
    print(f"6. 1f1b-flush, 2 workers on {device} over gloo, {steps} steps: simulated {sim.throughput:.0f} "
          f"samples/s ({where}loopback {loopback / 1e9:.1f} GB/s), measured {measured:.0f} samples/s in "
          f"the steady state ({run.throughput:.0f} over the whole run); measured / simulated "
          f"{measured / sim.throughput:.2f}")


def check_llm_memory() -> None:
    """7. a torchtitan-shaped Llama step: allocated against predicted, and the allocator's reserve."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    print("7. Llama 3.1 8B-shaped step (4 layers), one GPU:", flush=True)
    for conf in ("expandable_segments:True", "expandable_segments:False"):
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf, "PYTHONPATH": str(root)}
        done = subprocess.run([sys.executable, "-m", "reproductions.llm_acceptance.measured_step",
                               "--device", "cuda"], env=env, cwd=root, timeout=900, capture_output=True,
                              text=True, check=False)
        lines = (done.stdout.strip() or done.stderr.strip() or "(no output)").splitlines()
        print(f"   {lines[-1]}" + ("" if done.returncode == 0 else f" (exit {done.returncode})"), flush=True)


def main() -> int:
    """Run the checks and print their figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="minibatches per run")
    ap.add_argument("--loopback-bandwidth", type=float, default=2e9,
                    help="bytes/s the simulator assumes for gloo over loopback TCP")
    ap.add_argument("--dry-run-on-cpu", action="store_true",
                    help="run the same code on the CPU (to check the script; CUDA-only figures left out)")
    a = ap.parse_args()
    if a.dry_run_on_cpu:
        device = "cpu"
    elif torch.cuda.is_available():
        device = "cuda"
    else:
        print("no CUDA GPU here (torch.cuda.is_available() is False): nothing measured. Run this on a "
              "machine with CUDA; --dry-run-on-cpu checks the script on the CPU.")
        return 0
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (dry run)"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"gpu_checks on {name}, torch {torch.__version__}, {when}")
    prof = check_profile(device)
    check_reference(device, a.steps)
    check_processes(device, a.steps)
    check_wsp(device, a.steps)
    if device == "cuda":
        check_memory(prof, a.steps)
    else:
        print("5. memory: needs CUDA (torch.cuda.max_memory_allocated); skipped in the dry run")
    check_throughput(prof, device, max(a.steps, 12), a.loopback_bandwidth)
    if device == "cuda":
        check_llm_memory()
    else:
        print("7. transformer step memory: needs CUDA (the caching allocator's peaks); skipped in the dry "
              "run")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

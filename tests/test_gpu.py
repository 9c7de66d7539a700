"""The checks a GPU runs (marked ``gpu``; skipped, saying why, without CUDA) and what a machine without
one is told.

With CUDA: the profiler times layers with CUDA events; the reference executor on CUDA equals the CPU
within float tolerance; 2-4 worker processes computing on one shared GPU over gloo (messages staged
through host memory) equal the reference executor on that GPU, for a synchronous and an
asynchronous method; HetPipe's WSP parameter server serves CUDA workers; NCCL runs when there is
one GPU per worker and is refused, naming the shortfall, when there is not. Predicted peak memory
and simulated throughput against measured ones print figures in
``reproductions/benchmarks/gpu_checks.py`` (not asserted). The README's "GPU" section says which of
these have run on a real GPU.
"""

from __future__ import annotations

from typing import Any

import pytest
import test_runtime_async_helpers as A
import test_runtime_helpers as H
import torch

import pipelab as pl

HAS_CUDA = torch.cuda.is_available()
PAIR_L = 14


def _train(method: str, plan: Any, backend: str, *, model: str = "pair", steps: int = 4,
           microbatches: int = 2, **kw: Any) -> Any:
    pair = (H.pair, H.pair_data, H.loss_fn)
    model_fn, data, loss_fn = pair if model == "pair" else (A.mlp, A.data, A.loss_fn)
    return pl.train(model_fn, plan, method=method, data=data, loss_fn=loss_fn, optimizer=H.sgd, steps=steps,
                    microbatches=microbatches, backend=backend, progress=False, timeout=240, **kw)


# ---------------------------------------------------------------------- without a GPU: clear refusals
@pytest.mark.skipif(HAS_CUDA, reason="this machine has CUDA")
def test_cuda_device_without_cuda_is_refused() -> None:
    with pytest.raises(ValueError,
                       match=r"device='cuda' needs a CUDA GPU but torch.cuda.is_available\(\) is False"):
        _train("1f1b-flush", pl.Plan.from_boundaries(PAIR_L, [7]), "gloo", device="cuda")


def test_a_bad_device_is_refused() -> None:
    with pytest.raises(ValueError, match=r"device='tpu' must be 'cpu' or 'cuda'"):
        _train("1f1b-flush", pl.Plan.from_boundaries(PAIR_L, [7]), "local", device="tpu")


def test_nccl_names_the_missing_gpus_in_the_worker_too() -> None:
    """Under torchrun the parent's check does not run; the worker's own says what is missing."""
    from pipelab.runtime.job import TrainArgs, prepare
    from pipelab.runtime.process import stage_device

    job = prepare(TrainArgs.of(model_fn=H.mlp, plan=pl.Plan.from_boundaries(5, [2]), method="1f1b-flush",
                               data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=1, microbatches=2,
                               backend="local"))
    n = torch.cuda.device_count() if HAS_CUDA else 0
    job = type(job)(**{**job.__dict__, "backend": "nccl"})
    with pytest.raises(RuntimeError, match=rf"backend='nccl' puts worker 1 on cuda:{n} but this machine has "
                                           rf"{n} CUDA GPU\(s\); NCCL needs one GPU per worker"):
        stage_device(job, 1, local_rank=n)


# ---------------------------------------------------------------------- with a GPU
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_profile_on_cuda_times_with_cuda_events(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[int] = []
    real = torch.cuda.Event

    def counting(*a: Any, **k: Any) -> Any:
        made.append(1)
        return real(*a, **k)

    monkeypatch.setattr(torch.cuda, "Event", counting)
    x = torch.randn(16, 6)
    prof = pl.profile(H.mlp(), x, device="cuda", warmup=1, repeats=3, progress=False)
    assert prof.device.startswith("cuda")
    assert made, "the CUDA profile did not use CUDA events"
    assert all(layer.fwd_s > 0 for layer in prof.layers)
    cpu = pl.profile(H.mlp(), x, device="cpu", warmup=1, repeats=1, progress=False)
    assert prof.fingerprint() == cpu.fingerprint()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("method,cuts,reps,M,kw", [("1f1b-flush", [7], [1, 1], 2, {}),
                                                    ("pipedream", [4, 9], [1, 1, 1], 1, {})])
def test_reference_executor_on_cuda_equals_cpu(method: str, cuts: list[int], reps: list[int], M: int,
                                               kw: dict) -> None:
    plan = pl.Plan.from_boundaries(PAIR_L, cuts, reps)
    gpu = _train(method, plan, "local", microbatches=M, steps=6, device="cuda", **kw)
    cpu = _train(method, plan, "local", microbatches=M, steps=6, **kw)
    assert H.max_diff(gpu.state_dict(), cpu.state_dict()) < 1e-4
    assert gpu.losses == pytest.approx(cpu.losses, rel=1e-4, abs=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("method,cuts,reps,M,steps,kw", [
    ("1f1b-flush", [7], [1, 1], 2, 4, {}),                        # 2 workers, synchronous
    ("gpipe", [5, 9], [2, 1, 1], 4, 4, {}),                       # 4 workers: a replicated stage all-reduces
    ("pipedream", [4, 9], [1, 1, 1], 1, 8, {}),                   # 3 workers, asynchronous
    ("interleaved-1f1b", [3, 7, 10], [1, 1, 1, 1], 4, 3, {"chunks": 2}),
])
@pytest.mark.parametrize("match", ["tag", "order"])
def test_cuda_workers_over_gloo_on_one_gpu_equal_the_reference(method: str, cuts: list[int], reps: list[int],
                                                                M: int, steps: int, kw: dict, match: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_P2P_MATCH", match)
    plan = pl.Plan.from_boundaries(PAIR_L, cuts, reps)
    procs = _train(method, plan, "gloo", microbatches=M, steps=steps, device="cuda", **kw)
    ref = _train(method, plan, "local", microbatches=M, steps=steps, device="cuda", **kw)
    assert H.max_diff(procs.state_dict(), ref.state_dict()) < 1e-5
    cpu = _train(method, plan, "local", microbatches=M, steps=steps, **kw)
    assert H.max_diff(procs.state_dict(), cpu.state_dict()) < 1e-4


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_wsp_server_with_cuda_workers() -> None:
    from pipelab.runtime import param_server as wsp

    plan = pl.Plan.from_boundaries(5, [2], replicas=[2, 2])
    procs = _train("hetpipe", plan, "gloo", model="mlp5", microbatches=1, steps=8, D=0, device="cuda")
    ref = _train("hetpipe", plan, "local", model="mlp5", microbatches=1, steps=8, D=0, device="cuda")
    cpu = _train("hetpipe", plan, "local", model="mlp5", microbatches=1, steps=8, D=0)
    assert H.max_diff(procs.state_dict(), ref.state_dict()) < 1e-5
    assert H.max_diff(procs.state_dict(), cpu.state_dict()) < 1e-4
    assert wsp.check_trace(procs.trace, 0) == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_nccl_one_gpu_per_worker() -> None:
    plan = pl.Plan.from_boundaries(PAIR_L, [7])
    if torch.cuda.device_count() < 2:
        with pytest.raises(ValueError, match=r"backend='nccl' needs one CUDA GPU per worker \(2\) but this "
                                             r"machine has 1"):
            _train("1f1b-flush", plan, "nccl")
        return
    nccl = _train("1f1b-flush", plan, "nccl", steps=4)
    ref = _train("1f1b-flush", plan, "local", steps=4, device="cuda")
    assert H.max_diff(nccl.state_dict(), ref.state_dict()) < 1e-5

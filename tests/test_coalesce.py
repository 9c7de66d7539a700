"""Coalesced weight gradients (``coalesce_wgrad=True``, :mod:`pipelab.runtime.coalesce`).

Oracles: plain autograd on the same microbatches (unit), plain single-process SGD and the runtime
without the option (transparency). Spies check that the store is really used: no Linear weight
gradient exists after a ``B``, and each flush finds one ``(x, grad_out)`` pair per microbatch.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import test_runtime_helpers as H
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import pipelab as pl
from pipelab.runtime import coalesce
from pipelab.runtime.worker import Worker

PAIR_L = 14


def _plain_and_coalesced(make, xs):
    """Run every microbatch through a plain copy and a coalesced copy of ``make()``; both modules."""
    torch.manual_seed(0)
    plain = make()
    torch.manual_seed(0)
    ours = make()
    co = coalesce.install(ours)
    return plain, ours, co


@pytest.mark.parametrize("shape", [(5, 7), (3, 4, 7)], ids=["2d", "3d"])
def test_function_grads_equal_plain_autograd(shape):
    def make():
        return nn.Sequential(nn.Linear(7, 6), nn.Tanh(), nn.Linear(6, 4))

    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(*shape, generator=g) for _ in range(3)]
    plain, ours, co = _plain_and_coalesced(make, xs)
    assert len(co.linears) == 2
    for i, x in enumerate(xs):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        ya, yb = plain(a), ours(b)
        assert torch.allclose(ya, yb, atol=1e-6)
        w = torch.randn(ya.shape, generator=g)
        (ya * w).sum().backward()
        (yb * w).sum().backward()
        assert torch.allclose(a.grad, b.grad, atol=1e-6)          # input gradient per microbatch
        assert all(p.grad is None for p in ours.parameters())   # weight grads deferred, not accumulated
        assert co.pending == 2 * (i + 1)
    co.flush()
    assert co.pending == 0
    for (n, p), q in zip(plain.named_parameters(), ours.parameters()):
        assert q.grad is not None and q.grad.shape == p.shape, n
        assert torch.allclose(p.grad, q.grad, atol=1e-5), n
    # a second flush adds to the existing gradients, as .backward() would
    for x in xs[:1]:
        plain(x).sum().backward()
        ours(x).sum().backward()
    co.flush()
    for p, q in zip(plain.parameters(), ours.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)


def test_recompute_stores_each_microbatch_once_and_matches():
    def make():
        return nn.Sequential(nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 2, bias=False))

    g = torch.Generator().manual_seed(2)
    xs = [torch.randn(4, 5, generator=g) for _ in range(2)]
    plain, ours, co = _plain_and_coalesced(make, xs)
    for x in xs:
        plain(x).square().sum().backward()
        checkpoint(ours, x, use_reentrant=False).square().sum().backward()
    assert co.pending == 2 * len(xs)       # the recomputed forward does not store again
    co.flush()
    for p, q in zip(plain.parameters(), ours.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-5)


def test_frozen_and_eval_linears_are_left_to_autograd():
    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    co = coalesce.install(m)
    m.weight.requires_grad_(False)
    m.bias.requires_grad_(False)
    x = torch.randn(4, 3, requires_grad=True)
    m(x).sum().backward()
    assert co.pending == 0 and x.grad is not None
    with torch.no_grad():
        m(x)
    assert co.pending == 0
    co.uninstall()
    assert "forward" not in m.__dict__


def _train(method, cuts, reps, backend, *, steps=3, microbatches=4, **kw):
    plan = pl.Plan.from_boundaries(PAIR_L, cuts, reps)
    return pl.train(H.pair, plan, method=method, data=H.pair_data, loss_fn=H.loss_fn, optimizer=H.sgd,
                    steps=steps, microbatches=microbatches, backend=backend, progress=False, timeout=120,
                    **kw)


@pytest.fixture
def spy(monkeypatch):
    """Records, at every flush, how many pairs were pending; and checks no Linear grad exists after B."""
    record = {"flushes": [], "linears": 0, "grads_after_b": 0, "empty": 0}
    real_flush, real_install = coalesce.Coalescer.flush, coalesce.install
    real_backward = Worker._backward

    def flush(self):
        record["flushes"].append(self.pending)
        record["empty"] += bool(self.linears) and not self.pending
        real_flush(self)

    def install(module):
        co = real_install(module)
        record["linears"] += len(co.linears)
        return co

    def backward(self, st, m, received):
        out = real_backward(self, st, m, received)
        co = self.coalescers.get(st.index)
        if co is not None:
            record["grads_after_b"] += sum(lin.weight.grad is not None for lin in co.linears)
        return out

    monkeypatch.setattr(coalesce.Coalescer, "flush", flush)
    monkeypatch.setattr(coalesce, "install", install)
    monkeypatch.setattr(Worker, "_backward", backward)
    return record


@pytest.mark.parametrize("method,cuts,reps,opts", [
    ("1f1b-flush", [7], [1, 1], {}),
    ("gpipe", [5, 9], [2, 1, 1], {}),                 # replicated input stage: all-reduce after the flush
    ("interleaved-1f1b", [3, 7, 10], [1, 1, 1, 1], {"chunks": 2}),
    ("dp", [], [2], {}),
], ids=["1f1b-flush", "gpipe-replicated", "interleaved", "dp"])
def test_reference_executor_coalesces_and_equals_plain_sgd(spy, method, cuts, reps, opts):
    res = _train(method, cuts, reps, "local", coalesce_wgrad=True, **opts)
    assert H.max_diff(res.state_dict(), H.reference_pair(H.sgd, 3)) < 1e-5
    assert spy["linears"] >= 4 if method != "dp" else spy["linears"] == 2 * 4   # Pair has 4 Linears
    assert spy["grads_after_b"] == 0
    # every flush of a stage with Linears found pairs; all together one per Linear per microbatch
    assert spy["flushes"] and spy["empty"] == 0
    assert sum(spy["flushes"]) == 3 * 4 * 4


def test_transparent_with_recompute_and_compression(spy):
    kw = {"recompute": True, "compression": "bf16"}
    plain = _train("1f1b-flush", [7], [1, 1], "local", **kw)
    ours = _train("1f1b-flush", [7], [1, 1], "local", coalesce_wgrad=True, **kw)
    assert sum(spy["flushes"]) == 3 * 4 * 4 and spy["grads_after_b"] == 0
    assert H.max_diff(plain.state_dict(), ours.state_dict()) < 1e-5
    assert plain.losses == pytest.approx(ours.losses, abs=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("method,cuts", [("1f1b-flush", [7]), ("gpipe", [5])])
def test_processes_equal_plain_sgd_and_the_reference_executor(method, cuts):
    res = _train(method, cuts, [1, 1], "gloo", coalesce_wgrad=True)
    assert H.max_diff(res.state_dict(), H.reference_pair(H.sgd, 3)) < 1e-5
    local = _train(method, cuts, [1, 1], "local", coalesce_wgrad=True)
    assert H.max_diff(res.state_dict(), local.state_dict()) < 1e-6
    assert res.losses == pytest.approx(local.losses, abs=1e-6)


@pytest.mark.parametrize("method,opts", [("pipedream", {}), ("naive-async", {}), ("zb-h1", {}), ("2bw", {})])
def test_methods_whose_weights_change_within_a_minibatch_are_refused(method, opts):
    with pytest.raises(
        ValueError, match=rf"coalesce_wgrad=True is not supported for method '{method}'.*one of gpipe"
    ):
        _train(method, [7], [1, 1], "local", microbatches=1 if method != "zb-h1" else 4, coalesce_wgrad=True,
               **opts)


def test_bad_value_is_refused():
    with pytest.raises(ValueError, match="coalesce_wgrad='yes' must be True or False"):
        _train("1f1b-flush", [7], [1, 1], "local", coalesce_wgrad="yes")


_FAULTS = """
import resource, torch
from pipelab.runtime.options import tune_malloc
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
x = torch.randn(8, 1024)
def step():    # every step frees and makes again its gradients and GEMM outputs (4 MiB each)
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad()
def faults_per_step():
    for _ in range(3):
        step()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) // 10
before = faults_per_step()
print(before, tune_malloc(), faults_per_step())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_worker_malloc_tuning_stops_the_page_faults_of_reallocated_buffers():
    """Workers call tune_malloc(): freed gradient-sized buffers are reused, not faulted in again."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    p = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, env=env, timeout=120,
                       check=True)
    before, tuned, after = p.stdout.split()
    assert tuned == "True"
    # per step: up to 4 x 4 MiB of gradients = 4,096 pages of 4 KiB when they come fresh from the kernel
    # (glibc's dynamic thresholds keep some of them, so fewer in practice: 1,900-4,100 measured here)
    assert int(before) > 1_000, p.stdout
    # tuned: under a tenth of a step's 4,096 fresh pages (what remains is the interpreter's own), and
    # well under the untuned count, whose glibc thresholds vary from run to run (CHANGELOG.md)
    assert int(after) < 400 and int(after) * 4 < int(before), p.stdout

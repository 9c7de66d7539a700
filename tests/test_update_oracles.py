"""The asynchronous methods' weights after a few steps against their papers' update equations, written
here in plain PyTorch without pipelab's code (no schedule, no version rule, no policy is imported: the
version every stage reads is the paper's closed form).

Covered here: PipeDream §3.3 with weight stashing and with vertical sync (Narayanan et al., SOSP'19),
and PipeMare's learning-rate rescheduling (T1) and discrepancy correction (T2) (Yang et al., MLSys'21,
§3), with one and with N microbatches per minibatch. Already covered elsewhere, not repeated:
PipeDream-2BW's ``W(t+1) = W(t) - nu grad f(W(t-1))`` and the bounded buffer as pipelab defines it
(minibatch ``t`` reads ``W(max(0, t - (K - 1)))`` on every stage) against the delayed-SGD oracle
``delayed_reference`` and by hand (tests/test_runtime_async.py: ``test_2bw_rule_by_hand``,
``test_2bw_tiny_linear_model_by_hand``, ``test_delayed_policies_match_oracle_and_memory_model``).

The model is the helpers' 5-layer MLP cut after layers 1 and 3: stage 1 = fc1, stage 2 = relu fc2,
stage 3 = relu fc3 (stages counted from 1 as in the papers), plain SGD.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import test_runtime_async_helpers as H
import torch
from torch import nn
from torch.func import functional_call

from pipelab.partition.plan import Plan
from pipelab.runtime import train

P = 3
PLAN = Plan.from_boundaries(5, [1, 3])
LR = 0.1
Params = dict[str, torch.Tensor]


def stage_modules(seed: int = 0) -> list[nn.Module]:
    """The MLP's three stages as separate modules, with the weights ``pl.train`` starts from."""
    torch.manual_seed(seed)
    m = H.mlp()
    return [nn.Sequential(copy.deepcopy(m.fc1)), nn.Sequential(nn.ReLU(), copy.deepcopy(m.fc2)),
            nn.Sequential(nn.ReLU(), copy.deepcopy(m.fc3))]


def full_names(i: int, name: str) -> str:
    """A stage module's parameter name as the whole MLP's (stage 1 'fc1.weight' <- '0.weight')."""
    return f"fc{i + 1}.{name.split('.', 1)[1]}"


Reads = Callable[[int, int, int], int]


def oracle(steps: int, N: int, fwd: Reads, bwd: Callable[[int, int, int], int | None],
           lr_factor: Callable[[int, int], float] = lambda i, t: 1.0, correction: Any = 0.0,
           gamma: float = 0.5) -> dict[str, torch.Tensor]:
    """Asynchronous pipelined SGD as the papers write it.

    Minibatch ``t`` is split into ``N`` microbatches; microbatch ``j``'s forward on stage ``i`` (from
    1) uses weight version ``fwd(t, j, i)`` (version ``v`` = after ``v`` updates), its backward
    ``bwd(t, j, i)`` (``None``: the current weights, PipeMare's ``tau_bkwd = 0``), recomputing the
    stage's output from the input its forward received. Stage ``i``'s update after minibatch ``t``:
    ``w <- w - lr * lr_factor(i, t) * mean gradient``. With ``correction = c_i`` (a list) the current
    weights the backward uses are ``w - c_i * delta``, ``delta`` the moving average of weight changes
    ``delta <- gamma delta + (1 - gamma)(w_new - w_old)`` (PipeMare T2).
    """
    mods = stage_modules()
    hist: list[list[Params]] = [[{n: p.detach().clone() for n, p in m.named_parameters()}] for m in mods]
    delta = [{n: torch.zeros_like(p) for n, p in h[0].items()} for h in hist]
    corr = correction if isinstance(correction, list) else [correction] * P
    batches = iter(H.data())
    for t in range(steps):
        x, y = next(batches)
        acc = [{n: torch.zeros_like(p) for n, p in h[0].items()} for h in hist]
        for j, (xm, ym) in enumerate(zip(x.split(len(x) // N), y.split(len(y) // N))):
            inputs = []
            a = xm
            with torch.no_grad():
                for i in range(P):
                    inputs.append(a)
                    a = functional_call(mods[i], hist[i][fwd(t, j, i + 1)], (a,))
            g: torch.Tensor | None = None
            for i in reversed(range(P)):
                v = bwd(t, j, i + 1)
                w = hist[i][-1] if v is None else hist[i][v]
                if v is None and corr[i]:
                    w = {n: w[n] - corr[i] * delta[i][n] for n in w}
                w = {n: p.clone().requires_grad_(True) for n, p in w.items()}
                inp = inputs[i].clone().requires_grad_(i > 0)
                out = functional_call(mods[i], w, (inp,))
                if g is None:
                    H.loss_fn(out, ym).backward()
                else:
                    out.backward(g)
                for n, p in w.items():
                    acc[i][n] += p.grad
                g = inp.grad
        for i in range(P):
            old = hist[i][-1]
            new = {n: old[n] - LR * lr_factor(i + 1, t) * acc[i][n] / N for n in old}
            delta[i] = {n: gamma * delta[i][n] + (1 - gamma) * (new[n] - old[n]) for n in old}
            hist[i].append(new)
    return {full_names(i, n): p for i in range(P) for n, p in hist[i][-1].items()}


def run(method: str, steps: int, N: int = 1, **kw: Any) -> dict[str, torch.Tensor]:
    r = train(H.mlp, PLAN, method=method, data=H.data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=steps,
              microbatches=N, backend="local", progress=False, **kw)
    return r.state_dict()


def close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    return max(float((got[k] - want[k]).abs().max()) for k in want)


# ---------------------------------------------------------------------- PipeDream SOSP'19 §3.3
def test_pipedream_stashing_is_the_papers_equation() -> None:
    # w(t+1) = w(t) - nu grad f(w_1^(t-n+1), ..., w_n^(t)): stage i reads version t - n + i (0 before
    # the pipeline fills), forward and backward alike
    K = 9
    ver = lambda t, j, i: max(0, t - P + i)   # noqa: E731
    want = oracle(K, 1, ver, ver)
    assert close(run("pipedream", K), want) < 1e-6
    # the oracle can fail: reading the newest weights in every stage is plain SGD, and differs
    assert close(run("pipedream", K), oracle(K, 1, lambda t, j, i: t, lambda t, j, i: t)) > 1e-4


def test_vertical_sync_is_the_papers_equation() -> None:
    # w(t+1) = w(t) - nu grad f(w_1^(t-n+1), ..., w_n^(t-n+1)): every stage reads the input stage's version
    K = 9
    ver = lambda t, j, i: max(0, t - P + 1)   # noqa: E731
    assert close(run("pipedream", K, vertical_sync=True), oracle(K, 1, ver, ver)) < 1e-6
    stash = lambda t, j, i: max(0, t - P + i)   # noqa: E731
    assert close(run("pipedream", K, vertical_sync=True), oracle(K, 1, stash, stash)) > 1e-4


# ---------------------------------------------------------------------- PipeMare MLSys'21 §3
def mare_versions(N: int) -> tuple[Reads, Callable[[int, int, int], None], list[int]]:
    """PipeMare's reads on a 1F1B pipeline of P stages with N microbatches per minibatch (as pipelab
    defines it): stage i keeps G = P - i + 1 microbatches in flight, so microbatch m = tN + j's forward
    runs after the backwards of microbatches 0..m-G, i.e. after floor((m - G + 1) / N) updates; its
    backward reads the newest weights. tau_fwd,i = ceil((P - i) / N), tau_bkwd,i = 0."""
    def fwd(t: int, j: int, i: int) -> int:
        return max(0, (t * N + j - (P - i + 1) + 1) // N)
    taus = [math.ceil((P - i) / N) for i in range(1, P + 1)]
    return fwd, (lambda t, j, i: None), taus


def t1(taus: list[int], K: int) -> Callable[[int, int], float]:
    """T1: stage i's step size at step t is nu * tau_i ** -(1 - min(t / K, 1)) (tau < 1 counts as 1)."""
    return lambda i, t: max(taus[i - 1], 1) ** -(1 - min(t / K, 1))


@pytest.mark.parametrize("N", [1, 2])
def test_pipemare_is_the_papers_equation(N: int) -> None:
    K, warm, gamma = 9, 5, 0.5
    fwd, bwd, taus = mare_versions(N)
    got = run("pipemare", K, N, warmup_steps=warm, decay=gamma)
    # T1 and T2: the backward's weights w - (tau_fwd - tau_bkwd) delta
    want = oracle(K, N, fwd, bwd, t1(taus, warm), correction=[float(t) for t in taus], gamma=gamma)
    assert close(got, want) < 1e-6
    # each technique alone, and neither (naive asynchrony)
    only_t2 = run("pipemare", K, N, lr_reschedule=False, decay=gamma)
    assert close(only_t2, oracle(K, N, fwd, bwd, correction=[float(t) for t in taus], gamma=gamma)) < 1e-6
    only_t1 = run("pipemare", K, N, warmup_steps=warm, discrepancy_correction=False)
    assert close(only_t1, oracle(K, N, fwd, bwd, t1(taus, warm))) < 1e-6
    naive = oracle(K, N, fwd, bwd)
    assert close(run("naive-async", K, N), naive) < 1e-6
    # the oracle can fail: each technique changes the weights, except T1 where every tau <= 1 (its
    # factor tau ** -(...) is then 1: at N = 2 here, taus (1, 1, 0))
    assert min(close(got, naive), close(only_t2, naive)) > 1e-5
    if max(taus) > 1:
        assert close(only_t1, naive) > 1e-5
    else:
        assert close(only_t1, naive) < 1e-6


def test_pipedream_with_n_microbatches_is_stashed_delayed_sgd() -> None:
    # N microbatches per minibatch: each microbatch's forward and backward read the same (stashed)
    # version, floor((m - G + 1) / N) updates; the minibatch's update is the mean of its gradients
    K, N = 8, 2
    fwd, _, _ = mare_versions(N)
    assert close(run("pipedream", K, N), oracle(K, N, fwd, fwd)) < 1e-6

"""Tensor × pipeline parallelism: a stage as a group of gloo processes, exact against plain training.

Oracles: plain single-process SGD of the whole GPT (tests/tp_models.py) for the synchronous methods;
for PipeDream the same schedule without tensor parallelism (its weight versions are the oracle's)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import tp_models as T

import pipelab as pl

LAYERS = 46          # tp_models.GPT traced (pipelab.graph.layer_nodes)
CUT = 24             # after block 0's residual add
STEPS = 2


def plain_sgd(steps: int = STEPS) -> dict[str, torch.Tensor]:
    """The oracle: the whole model trained on one process, minibatch SGD."""
    torch.manual_seed(0)
    model = T.gpt()
    opt = T.sgd(model.parameters())
    it = iter(T.data())
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        T.loss_fn(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def tensor_plan(boundaries: list[int], tensor: int) -> pl.Plan:
    plan = pl.Plan.from_boundaries(LAYERS, boundaries)
    return dataclasses.replace(plan, stages=tuple(dataclasses.replace(s, tensor=tensor) for s in plan.stages))


def run(plan: pl.Plan, method: str, **kw) -> pl.runtime.RunResult:
    return pl.train(T.gpt, plan, method=method, data=T.data, loss_fn=T.loss_fn, optimizer=T.sgd, steps=STEPS,
                    microbatches=2, progress=False, timeout=120, **kw)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush"])
def test_two_by_two_equals_plain_sgd(method: str) -> None:
    res = run(tensor_plan([CUT], 2), method)
    assert max_diff(res.state_dict(), plain_sgd()) < 1e-5
    assert res.trace.meta["tensor_groups"] == [[0, 2], [1, 3]]
    assert {e.worker for e in res.member_events} == {2, 3}


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush"])
def test_two_by_one_equals_plain_sgd(method: str) -> None:
    res = run(tensor_plan([], 2), method)
    assert max_diff(res.state_dict(), plain_sgd()) < 1e-5
    assert res.trace.meta["tensor_groups"] == [[0, 1]] and {e.worker for e in res.trace.events} == {0}

"""Importable models, data and oracles for the runtime tests (spawned workers import this module).

Workers receive callables by reference, so everything here is a top-level function.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

BATCH = 8


class MLP(nn.Module):
    """5 layers: fc1 relu fc2 relu fc3."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(6, 12), nn.Linear(12, 12), nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class SkipCNN(nn.Module):
    """A small CNN with a residual connection (a skip value crosses the middle cuts)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 3, 3, padding=1)
        self.conv2 = nn.Conv2d(3, 3, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.conv1(x))
        b = torch.relu(self.conv2(a)) + a
        return self.fc(torch.flatten(self.pool(b), 1))


def mlp() -> nn.Module:
    return MLP()


def cnn() -> nn.Module:
    return SkipCNN()


def _batches(shape: tuple[int, ...], n: int, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        yield torch.randn(BATCH, *shape, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def mlp_data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    return _batches((6,), 12, 1)


def cnn_data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    return _batches((1, 6, 6), 12, 2)


def bad_shape_data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    return _batches((5,), 4, 1)


def later_bad_data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """First minibatch fine, the second has the wrong feature count (caught in the worker)."""
    g = torch.Generator().manual_seed(3)
    yield torch.randn(BATCH, 6, generator=g), torch.randint(0, 3, (BATCH,), generator=g)
    yield torch.randn(BATCH, 7, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, y)


sgd = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)
adam = functools.partial(torch.optim.Adam, lr=0.01)


_LOSS_CALLS = [0]


def exploding_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The loss, raising on its 5th call in a process (the 4th microbatch of a worker; fault tests)."""
    _LOSS_CALLS[0] += 1
    if _LOSS_CALLS[0] == 5:
        raise RuntimeError("boom: deliberate failure")
    return F.cross_entropy(out, y)


class Slow(nn.ReLU):
    """A ReLU that sleeps (so a job runs long enough to be cancelled)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        import time
        time.sleep(0.05)
        return torch.relu(x)


def slow_mlp() -> nn.Module:
    m = MLP()
    return nn.Sequential(m.fc1, Slow(), m.fc2, nn.ReLU(), m.fc3)


def long_data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    return _batches((6,), 400, 5)


def reference_training(
    model_fn: Any, data_fn: Any, opt_fn: Any, steps: int, seed: int = 0
) -> dict[str, torch.Tensor]:
    """The oracle: plain single-process minibatch training of the whole model."""
    torch.manual_seed(seed)
    model = model_fn()
    opt = opt_fn(model.parameters())
    it = iter(data_fn())
    for _ in range(steps):
        x, y = next(it)
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float((a[k] - b[k]).abs().max()) for k in a)


class Pair(nn.Module):
    """An MLP branch and a CNN branch side by side: two inputs, several values cross every cut."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp, self.cnn = MLP(), SkipCNN()

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> torch.Tensor:
        return self.mlp(x) + self.cnn(img)


def pair() -> nn.Module:
    return Pair()


def pair_data() -> Iterator[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]]:
    g = torch.Generator().manual_seed(4)
    for _ in range(12):
        yield ((torch.randn(BATCH, 6, generator=g), torch.randn(BATCH, 1, 6, 6, generator=g)),
               torch.randint(0, 3, (BATCH,), generator=g))


def reference_pair(opt_fn: Any, steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = pair()
    opt = opt_fn(model.parameters())
    it = iter(pair_data())
    for _ in range(steps):
        (x, img), y = next(it)
        opt.zero_grad()
        loss_fn(model(x, img), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def stage_param_names(model_fn: Any, plan: Any) -> list[set[str]]:
    """Per plan stage, the names (as in model.state_dict()) of the parameters it holds."""
    from pipelab.graph import build_stage, trace

    torch.manual_seed(0)
    gm = trace(model_fn())
    return [
        {n for n, _ in build_stage(gm, s.start, s.end).graph_module.named_parameters()} for s in plan.stages
    ]


def stale_weight_oracle(model_fn: Any, data_fn: Any, opt_fn: Any, plan: Any, versions: Any,
                        steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """PipeDream's semantics written as plain SGD with stale weights (an independent oracle).

    ``versions[s][k]`` is the version stage ``s``'s weights had when minibatch ``k`` was computed
    (forward and backward alike: weight stashing). The gradient of minibatch ``k`` is the plain
    gradient of the whole model evaluated with every stage at its version; stage ``s`` applies it
    to its newest weights (SOSP'19 §3.3). Version ``v`` = after ``v`` updates.
    """
    torch.manual_seed(seed)
    model = model_fn()
    names = stage_param_names(model_fn, plan)
    params = dict(model.named_parameters())
    hist = [[{n: params[n].detach().clone() for n in ns}] for ns in names]
    live = [{n: params[n].detach().clone().requires_grad_() for n in ns} for ns in names]
    opts = [opt_fn(list(lv.values())) if lv else None for lv in live]
    it = iter(data_fn())
    for k in range(steps):
        x, y = next(it)
        xs = x if isinstance(x, tuple) else (x,)
        at = {}
        for s in range(len(names)):
            at.update({n: t.clone().requires_grad_() for n, t in hist[s][versions[s][k]].items()})
        loss = loss_fn(torch.func.functional_call(model, at, xs), y)
        grads = torch.autograd.grad(loss, list(at.values()))
        g = dict(zip(at, grads))
        for s in range(len(names)):
            for n, t in live[s].items():
                t.grad = g[n].clone()
            if opts[s] is not None:
                opts[s].step()
            hist[s].append({n: t.detach().clone() for n, t in live[s].items()})
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for s in range(len(names)):
        out.update(hist[s][-1])
    return out


def f_versions(schedule: Any) -> list[dict[int, int]]:
    """Per stage, microbatch -> version its F reads, from the schedule's versions."""
    out: list[dict[int, int]] = [{} for _ in range(schedule.num_stages)]
    for w, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            if a.kind == "F":
                out[a.stage][a.microbatch] = schedule.version_of(w, i)
    return out


class DropoutMLP(MLP):
    """The MLP with dropout: each worker's random stream must be the same in a process and locally."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.dropout(F.relu(self.fc2(F.relu(self.fc1(x)))), 0.3, self.training))


def dropout_mlp() -> nn.Module:
    return DropoutMLP()


def test_runtime_options_record_is_frozen_and_checked() -> None:
    import dataclasses

    import pytest

    from pipelab.runtime.options import RuntimeOptions

    rt = RuntimeOptions.from_options("pipemare", {"compression": "int8", "slowdown": {1: 2},
                                                  "warmup_steps": 5})
    assert rt.compression == "int8" and rt.slowdown == {1: 2.0} and rt.method == {"warmup_steps": 5}
    assert RuntimeOptions.from_options("gpipe", {"compression": "none"}).compression is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        rt.recompute = True  # type: ignore[misc]
    with pytest.raises(ValueError, match="needs checkpoint_dir"):
        RuntimeOptions.from_options("gpipe", {"checkpoint_every": 2})
    with pytest.raises(ValueError, match="not runtime options of method 'gpipe'"):
        RuntimeOptions.from_options("gpipe", {"warmup_steps": 5})

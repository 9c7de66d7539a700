"""Outputs and buffers: a dataclass / namedtuple / ModelOutput output reaches the loss as its own type;
recompute leaves BatchNorm's running statistics as one forward would.

Oracles: plain single-process training of the whole model, microbatch by microbatch for BatchNorm
(which normalises each microbatch with its own statistics).
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import pipelab as pl

pytestmark = pytest.mark.timeout(180)


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    hidden: torch.Tensor


Pair = collections.namedtuple("Pair", "logits hidden")


class Net(nn.Module):
    def __init__(self, kind: str = "tensor") -> None:
        super().__init__()
        self.kind = kind
        self.fc1, self.bn, self.fc2 = nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)

    def forward(self, x):
        h = torch.relu(self.bn(self.fc1(x)))
        y = self.fc2(h)
        if self.kind == "dataclass":
            return Out(y, h)
        if self.kind == "namedtuple":
            return Pair(y, h)
        if self.kind == "modeloutput":
            from transformers.modeling_outputs import SequenceClassifierOutput

            return SequenceClassifierOutput(logits=y, hidden_states=(h,))
        return y


def data():
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        yield torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


def reference(kind: str, steps: int, microbatches: int) -> dict[str, torch.Tensor]:
    """Plain SGD on the whole model; each microbatch's forward on its own (as a pipeline runs it)."""
    torch.manual_seed(0)
    model = Net(kind)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _, (x, y) in zip(range(steps), data()):
        opt.zero_grad()
        for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
            (_loss(model(xm), ym) / microbatches).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _loss(out, y):
    logits = out if isinstance(out, torch.Tensor) else out.logits
    return F.cross_entropy(logits, y)


def _typed_loss(kind: str):
    types = {"dataclass": Out, "namedtuple": Pair}

    def loss(out, y):
        if kind == "modeloutput":
            from transformers.modeling_outputs import SequenceClassifierOutput

            assert isinstance(out, SequenceClassifierOutput), type(out)
        elif kind in types:
            assert isinstance(out, types[kind]), type(out)
        return _loss(out, y)

    return loss


def _train(kind: str, recompute: bool, method: str = "gpipe", plan=None):
    prof = pl.profile(Net(kind), next(data())[0], repeats=1, warmup=0, progress=False, small_batch=None,
                      whole=False)
    plan = plan or pl.Plan.from_boundaries(len(prof), [1], profile=prof)
    return pl.train(lambda: Net(kind), plan, method=method, data=data, loss_fn=_typed_loss(kind),
                    optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), steps=2, microbatches=2,
                    backend="local", progress=False, recompute=recompute)


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.parametrize("kind", ["dataclass", "namedtuple", "modeloutput"])
def test_structured_output_reaches_the_loss_as_its_own_type(kind):
    if kind == "modeloutput":
        pytest.importorskip("transformers")
    run = _train(kind, recompute=False)
    assert _max_diff(run.state_dict(), reference(kind, 2, 2)) < 1e-6


@pytest.mark.parametrize("method", ["gpipe", "1f1b-flush"])
def test_recompute_leaves_batchnorm_statistics_as_one_forward(method):
    ref = reference("tensor", 2, 2)
    plain = _train("tensor", recompute=False, method=method).state_dict()
    again = _train("tensor", recompute=True, method=method).state_dict()
    assert int(again["bn.num_batches_tracked"]) == int(ref["bn.num_batches_tracked"]) == 2 * 2
    assert _max_diff(again, ref) < 1e-6
    assert _max_diff(again, plain) == 0.0


def test_data_parallel_replicas_keep_their_own_buffers_and_the_first_replicas_are_returned():
    """dp on 2 replicas: parameters equal plain SGD; each replica's BatchNorm saw only its own
    microbatches, and the run returns the first (lowest-rank) replica's buffers (docs/transformers.md)."""
    prof = pl.profile(Net(), next(data())[0], repeats=1, warmup=0, progress=False, small_batch=None,
                      whole=False)
    plan = pl.Plan.from_boundaries(len(prof), [], [2], method="dp", profile=prof)
    run = pl.train(Net, plan, method="dp", data=data, loss_fn=_loss, steps=2, microbatches=2,
                   optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), backend="local", progress=False)
    state = run.state_dict()
    # the oracle: plain SGD on microbatch halves, with one set of BatchNorm buffers per replica
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    names = ("running_mean", "running_var", "num_batches_tracked")
    own = [{n: getattr(model.bn, n).clone() for n in names} for _ in range(2)]
    for _, (x, y) in zip(range(2), data()):
        opt.zero_grad()
        for replica, (xm, ym) in enumerate(zip(x.chunk(2), y.chunk(2))):
            for n in names:
                getattr(model.bn, n).copy_(own[replica][n])
            (_loss(model(xm), ym) / 2).backward()
            own[replica] = {n: getattr(model.bn, n).clone() for n in names}
        opt.step()
    for k, v in model.named_parameters():
        assert torch.allclose(state[k], v, atol=1e-6), k
    assert int(state["bn.num_batches_tracked"]) == 2        # one microbatch per step reached this replica
    for n in names:
        assert torch.allclose(state[f"bn.{n}"].double(), own[0][n].double(), atol=1e-6), n
        if n != "num_batches_tracked":
            assert not torch.allclose(own[0][n], own[1][n], atol=1e-6)   # the replicas' buffers differ

"""What the loss saves for its backward, measured by the profiler and carried by the memory model.

The runtime's last stage computes the loss inside its forward, under the memory meter's
``saved_tensors_hooks`` (:mod:`pipelab.runtime.memory`), so what autograd saves for the loss's
backward is held with the stage's activations until its backward. Oracles: closed forms of what
``F.cross_entropy`` and ``F.mse_loss`` save (torch's derivative formulas: ``log_softmax`` saves its
result, ``nll_loss`` its target and the 0-dim total weight; ``mse_loss`` its input and target), and the
runtime's measured peak on a 2-stage run (the pattern of ``tests/test_memory_measured.py``).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipelab as pl
from pipelab.cli import main
from pipelab.costs import CostModel

D, C, b, M, K = 4, 6, 64, 4, 3
B = M * b
FLOAT, LONG = 4, 8


def chain(out: int = D, last: nn.Module | None = None) -> nn.Module:
    """3 bias-free Linear(D, D) and a Linear(D, out), optionally followed by ``last``."""
    layers = [nn.Linear(D, D, bias=False) for _ in range(3)] + [nn.Linear(D, out, bias=False)]
    return nn.Sequential(*layers, *([last] if last is not None else []))


def classes() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """K minibatches of B rows with class targets in 0..C-1."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(B, D, generator=g), torch.randint(0, C, (B,), generator=g)) for _ in range(K)]


def regression() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """K minibatches of B rows with real targets of width D."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(B, D, generator=g), torch.randn(B, D, generator=g)) for _ in range(K)]


def test_cross_entropy_saves_the_log_softmax_and_the_targets() -> None:
    """``cross_entropy`` on logits (B, C): the log-softmax (B*C*4), the int64 targets (B*8) and nll_loss's
    0-dim total weight (4); the same whether the targets are passed as ``target=`` or captured."""
    x, y = classes()[0]
    want = B * C * FLOAT + B * LONG + FLOAT
    prof = pl.profile(chain(C), x, loss_fn=F.cross_entropy, target=y, progress=False)
    assert prof.loss_saved_bytes == want
    one_arg = pl.profile(chain(C), x, loss_fn=lambda out: F.cross_entropy(out, y), progress=False,
                         small_batch=None)
    assert one_arg.loss_saved_bytes == want
    # targets sliced from a larger tensor count by their own size, not their storage's
    big = torch.randint(0, C, (10 * B,))
    sliced = pl.profile(chain(C), x, loss_fn=F.cross_entropy, target=big[:B], progress=False,
                        small_batch=None)
    assert sliced.loss_saved_bytes == want
    assert pl.profile(chain(C), x, progress=False, small_batch=None).loss_saved_bytes == 0


def test_mse_counts_the_model_output_once() -> None:
    """``mse_loss`` saves its input (the model's output) and its target. The output counts in the loss
    unless a layer counts it already: a closing Sigmoid saves its own result, which is then in its
    ``saved_bytes`` and not in the loss's."""
    x, y = regression()[0]
    prof = pl.profile(chain(), x, loss_fn=F.mse_loss, target=y, progress=False)
    assert prof.loss_saved_bytes == 2 * B * D * FLOAT
    sig = pl.profile(chain(last=nn.Sigmoid()), x, loss_fn=F.mse_loss, target=y, progress=False)
    assert sig.layers[-1].saved_bytes == B * D * FLOAT and sig.layers[-1].out_saved
    assert sig.loss_saved_bytes == B * D * FLOAT


def test_bad_loss_calls_say_what_to_do() -> None:
    """A two-argument loss without ``target=``, ``target=`` without a loss, a loss that is not a scalar."""
    x, y = classes()[0]
    with pytest.raises(ValueError, match="pass target="):
        pl.profile(chain(C), x, loss_fn=F.cross_entropy, progress=False)
    with pytest.raises(ValueError, match="without loss_fn"):
        pl.profile(chain(C), x, target=y, progress=False)
    with pytest.raises(ValueError, match="scalar"):
        pl.profile(chain(C), x, loss_fn=lambda o: o * 2, progress=False)


def test_profile_files_and_rescaling_carry_it(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """JSON round trip (``pipelab profile --show`` says it); a file written before the field existed loads
    as 0; ``at_batch_size`` scales it with the batch; PipeDream's imported profiles have no loss term."""
    x, y = classes()[0]
    prof = pl.profile(chain(C), x, loss_fn=F.cross_entropy, target=y, progress=False, small_batch=b)
    assert prof.loss_saved_bytes == B * C * FLOAT + B * LONG + FLOAT     # the whole batch's, not b's
    path = prof.save(tmp_path / "p.json")
    assert pl.Profile.load(path) == prof
    capsys.readouterr()
    assert main(["profile", "--show", str(path)]) == 0
    assert f"the loss saves {prof.loss_saved_bytes / 1e6:.3f} MB" in capsys.readouterr().out
    doc = json.loads(path.read_text())
    doc.pop("loss_saved_bytes")
    path.write_text(json.dumps(doc))
    assert pl.Profile.load(path).loss_saved_bytes == 0
    assert prof.at_batch_size(b).loss_saved_bytes == round(prof.loss_saved_bytes / M)
    assert prof.scaled(time=2.0).loss_saved_bytes == prof.loss_saved_bytes
    assert pl.Profile.open("vgg16").loss_saved_bytes == 0
    with pytest.raises(ValueError, match="loss_saved_bytes"):
        pl.Profile(layers=prof.layers, cut_bytes=prof.cut_bytes, batch_size=B, loss_saved_bytes=-1)


def test_the_cost_model_puts_it_on_the_last_stage() -> None:
    """Only a range ending at the last layer gains ``ceil(loss_saved / M)`` per microbatch, in
    ``activation_bytes`` and ``memory_arrays`` alike (the one formula path); not when the forward
    builds no graph (``recompute=True``: the loss saves nothing either)."""
    x, y = classes()[0]
    prof = pl.profile(chain(C), x, loss_fn=F.cross_entropy, target=y, progress=False, small_batch=None)
    bare = pl.Profile(**{**prof.__dict__, "loss_saved_bytes": 0})
    cl = pl.Cluster.flat(2, bandwidth=1e9)
    cm, cm0 = CostModel(prof, cl), CostModel(bare, cl)
    n, L = len(prof), prof.loss_saved_bytes
    P, A = cm.memory_arrays(M)
    for i in range(n):
        for j in range(i + 1, n + 1):
            got, base = cm.activation_bytes(i, j, M), cm0.activation_bytes(i, j, M)
            assert A[i, j] == got
            if j < n:
                assert got == base
            else:
                assert base + L // M <= got <= base + -(-L // M)
            rc = cm.activation_bytes(i, j, M, recompute=True)
            assert rc == cm0.activation_bytes(i, j, M, recompute=True)


sgd = functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9)
PLAN = pl.Plan.from_boundaries(4, [2], batch_size=B)


def _train(model_fn: Any, data: Any, loss_fn: Any, method: str) -> Any:
    return pl.train(model_fn, PLAN, method=method, data=data, loss_fn=loss_fn, optimizer=sgd, steps=K,
                    microbatches=M, backend="local", progress=False, measure_memory=True)


@pytest.mark.parametrize("method,alive", [("gpipe", M), ("1f1b-flush", 1)])
def test_predicted_last_stage_peak_equals_the_measured_one_with_cross_entropy(method: str,
                                                                             alive: int) -> None:
    """The last stage's simulated peak against the runtime's ``peak_state``, cross-entropy on logits of
    width C. Per in-flight microbatch the runtime holds the log-softmax (``b*C*4``), the 0-dim
    total weight (4) and the 0-dim loss (4); the profile's loss term gives ``b*C*4 + b*8 + 1`` of it
    per microbatch (4 bytes over M rounded up). The targets are slices of the feed's minibatch:
    the runtime counts that storage whole, ``B*8``, once, the profile ``b*8`` per microbatch in flight.
    Both stages' peaks otherwise equal, byte for byte (without the loss term the last stage's is
    ``alive * b*C*4`` short: the error this fixes)."""
    x, y = classes()[0]
    model_fn = functools.partial(chain, C)
    prof = pl.profile(model_fn(), x, loss_fn=F.cross_entropy, target=y, progress=False)
    assert prof.loss_saved_bytes == B * C * FLOAT + B * LONG + FLOAT
    cl = pl.Cluster.flat(2, bandwidth=1e9)
    sim = pl.simulate(PLAN, prof, cl, method=method, microbatches=M, minibatches=K, optimizer="sgd-momentum")
    old = pl.simulate(PLAN, pl.Profile(**{**prof.__dict__, "loss_saved_bytes": 0}), cl, method=method,
                      microbatches=M, minibatches=K, optimizer="sgd-momentum")
    run = _train(model_fn, classes, F.cross_entropy, method)
    targets = B * LONG - alive * b * LONG
    assert sim.peak_memory[1] + alive * (FLOAT + FLOAT - 1) + targets == run.peak_state[1]
    assert old.peak_memory[1] + alive * (b * C * FLOAT + 2 * FLOAT) + B * LONG == run.peak_state[1]
    assert sim.peak_memory[0] == old.peak_memory[0]


def test_predicted_last_stage_peak_equals_the_measured_one_with_mse() -> None:
    """MSE saves the model's output (the last Linear does not save it: ``b*D*4`` per microbatch) and the
    targets (the feed's minibatch storage, ``B*D*4``, once); the runtime adds each in-flight
    microbatch's 0-dim loss. 1F1B on 2 stages: one microbatch in flight on the last stage."""
    x, y = regression()[0]
    prof = pl.profile(chain(), x, loss_fn=F.mse_loss, target=y, progress=False)
    cl = pl.Cluster.flat(2, bandwidth=1e9)
    sim = pl.simulate(PLAN, prof, cl, method="1f1b-flush", microbatches=M, minibatches=K,
                      optimizer="sgd-momentum")
    run = _train(chain, regression, F.mse_loss, "1f1b-flush")
    assert sim.peak_memory[1] + FLOAT + (B - b) * D * FLOAT == run.peak_state[1]
    assert np.isclose(prof.loss_saved_bytes, 2 * B * D * FLOAT)

"""The runtime's measured memory (``measure_memory=True``, :mod:`pipelab.runtime.memory`) against
closed forms, and against the simulator's prediction where both count the same bytes.

The oracle model: 4 bias-free ``Linear(D, D)`` layers on 2 stages, a minibatch of ``B = M * b`` rows,
loss ``out.sum()`` (it saves nothing), SGD with momentum. Per in-flight microbatch a stage holds, as
autograd saves them, each Linear's input (``b * D * 4`` bytes), and as the runtime keeps them, the
stage's input and output: on the first stage the input is a slice of the data feed's minibatch
(its storage, ``B * D * 4``, is counted once) and the output ``b * D * 4``; on the last stage the
input is the received message (``b * D * 4``) and the output the 0-dim loss (4 bytes). Weights,
gradients and momentum are ``2 * D * D * 4`` bytes each per stage; gradients live from the first
backward to the update, momentum from the first update on.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from torch import nn

import pipelab as pl
from pipelab.runtime.memory import MemoryMeter

D, b, M, K = 4, 64, 4, 3
B = M * b
FLOAT = 4


def model() -> nn.Module:
    """4 bias-free Linear layers."""
    return nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(4)])


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """K minibatches of B rows."""
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(B, D, generator=g), torch.randn(B, D, generator=g)) for _ in range(K)]


def sum_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A loss that saves nothing for backward."""
    return out.sum()


sgd = functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9)
PLAN = pl.Plan.from_boundaries(4, [2], batch_size=B)
W = 2 * D * D * FLOAT                        # a stage's weights (= its gradients = its momentum)
A0 = 2 * b * D * FLOAT                       # first stage, per microbatch: Linear 2's input + the output
X = B * D * FLOAT                            # first stage: the feed's minibatch storage
A1 = 2 * b * D * FLOAT + FLOAT               # last stage: the received input, Linear 4's input, the loss


def _train(method: str, backend: str = "local", **kw: Any) -> Any:
    return pl.train(model, PLAN, method=method, data=data, loss_fn=sum_loss, optimizer=sgd, steps=K,
                    microbatches=M, backend=backend, progress=False, measure_memory=True, **kw)


def test_gpipe_holds_every_microbatch() -> None:
    """GPipe: after the M forwards of a minibatch (no gradient buffer yet, momentum from the first
    update) a stage holds all M microbatches."""
    r = _train("gpipe")
    assert r.peak_state[0] == W + W + X + M * A0
    assert r.peak_state[1] == W + W + M * A1
    parts = r.memory_breakdown[0]     # the parts at the peak with messages (the mailbox's gradients)
    assert sum(parts.values()) == r.peak_held[0] == r.peak_memory[0]
    assert (parts["weights"], parts["optimizer"]) == (W, W)


def test_1f1b_holds_p_minus_s_microbatches() -> None:
    """1F1B-flush on P = 2 stages: stage s holds P - s microbatches, and the gradient buffer (a forward
    follows the minibatch's first backward)."""
    r = _train("1f1b-flush")
    assert r.peak_state[0] == W + W + W + X + 2 * A0
    assert r.peak_state[1] == W + W + W + 1 * A1
    # the timeline: nothing but weights before the first action's count, momentum after the first U
    assert r.memory_timeline[0][0][1] >= W
    assert max(b for _, b in r.memory_timeline[1]) == r.peak_held[1]


def test_predicted_equals_measured_where_both_count_the_same() -> None:
    """The profile's saved bytes (each Linear's input, counted at the layer producing it) plus the
    stage input equal what the runtime holds (the Linears' inputs and the stage's output); the
    simulator's peak is the
    measured one, byte for byte, but for the feed's minibatch storage and the losses (GPipe, 1F1B,
    zero bubble: the output gradient a split B keeps for W)."""
    x = data()[0][0]
    prof = pl.profile(model(), x, progress=False)
    cl = pl.Cluster.flat(2, bandwidth=1e9)
    # 1F1B: the feed's whole minibatch stays alive while P - s = 2 of its slices are in flight; the
    # last stage keeps each in-flight microbatch's 0-dim loss (4 bytes), which the profile leaves out
    for method, feed, alive in (("gpipe", 0, M), ("1f1b-flush", (M - 2) * b * D * FLOAT, 1),
                                ("zb-h1", (M - 2) * b * D * FLOAT, 2)):   # F(m + 1) before W(m)
        sim = pl.simulate(PLAN, prof, cl, method=method, microbatches=M, minibatches=K,
                          optimizer="sgd-momentum")
        run = _train(method)
        assert sim.peak_memory[0] + feed == run.peak_state[0], method
        assert sim.peak_memory[1] + alive * FLOAT == run.peak_state[1], method


def test_zero_bubble_releases_activations_at_w_and_async_methods_stash() -> None:
    """zb-h1 keeps a microbatch's graph from F through W; PipeDream's stash adds weight copies."""
    r = _train("zb-h1")
    assert r.peak_state[1] >= W + W + A1
    p = pl.train(model, PLAN, method="pipedream", data=data, loss_fn=sum_loss, optimizer=sgd, steps=K,
                 microbatches=1, backend="local", progress=False, measure_memory=True)
    assert p.memory_breakdown[0]["weights"] in (W, 2 * W)
    assert p.peak_state[0] >= p.weight_bytes[0]


def test_split_backward_frees_what_only_the_input_gradient_needed() -> None:
    """A stage that starts with a ReLU: its node lies only on the input gradient's path, so ``B`` runs
    it (keeping the graph for ``W``) and ``W`` does not. ReLU saves its own output; the meter once held
    that output with its ``grad_fn``, a cycle no collector breaks, and the count grew by the ReLU's
    output every microbatch (zb-h1 on the digits CNN measured twice the predicted peak). Oracle: the
    count after each update is the same at every minibatch once the optimizer state exists, and the
    last stage's peak over two minibatches equals its peak over three."""
    def relu_model() -> nn.Module:
        return nn.Sequential(nn.Linear(D, D, bias=False), nn.Linear(D, D, bias=False), nn.ReLU(),
                             nn.Linear(D, D, bias=False))

    plan = pl.Plan.from_boundaries(4, [2], batch_size=B)
    def run(method: str, steps: int) -> Any:
        return pl.train(relu_model, plan, method=method, data=data, loss_fn=sum_loss, optimizer=sgd,
                        steps=steps, microbatches=M, backend="local", progress=False, measure_memory=True)

    zb = run("zb-h1", K)
    after_update = [held for (i, held) in zb.memory_timeline[1]
                    if zb.schedule.actions[1][i].kind == "U"]
    assert len(after_update) == K and after_update[1] == after_update[2], after_update
    assert run("zb-h1", 2).peak_state[1] == zb.peak_state[1]


def test_the_count_follows_the_graph_lifetime() -> None:
    """A saved tensor counts while its graph lives: the meter's count returns to the weights once the
    graph is dropped, and storages are counted once however often autograd saves them."""
    lin = nn.Linear(8, 8)
    st = type("St", (), {})()
    st.params, st.optimizer, st.pending = dict(lin.named_parameters()), None, {}
    st.policy = type("Pol", (), {})()
    meter = MemoryMeter({0: st})
    w = meter.count()["total"]
    assert w == (8 * 8 + 8) * FLOAT
    x = torch.randn(16, 8)
    with meter.saving():
        y = lin(x) * lin(x)    # x saved twice (one storage); the two outputs saved by the product
    assert meter.count()["activations"] == 3 * 16 * 8 * FLOAT
    y.sum().backward()         # frees the graph's saved tensors
    assert meter.count()["activations"] == 0
    assert meter.count()["gradients"] == (8 * 8 + 8) * FLOAT


def test_processes_count_messages_and_the_same_state() -> None:
    """Two gloo processes: the message buffers (receives posted ahead, sends not yet retired) are a part
    of their own; the rest is the reference executor's count except the received inputs' storage (a
    padded message buffer instead of the mailbox's copy)."""
    r = _train("1f1b-flush", backend="gloo", shared_memory=False)
    assert r.peak_state[0] == W + W + W + X + 2 * A0
    assert r.peak_held[0] >= r.peak_state[0]
    assert any(b["messages"] > 0 for b in r.memory_breakdown.values())
    assert r.peak_memory == r.peak_held


def test_measure_memory_off_reports_nothing_and_rejects_non_bools() -> None:
    """Off by default: no peaks; a non-bool value is refused with the reason."""
    r = pl.train(model, PLAN, method="gpipe", data=data, loss_fn=sum_loss, optimizer=sgd, steps=1,
                 microbatches=M, backend="local", progress=False)
    assert r.peak_memory == {}
    with pytest.raises(ValueError, match="measure_memory=1 must be True or False"):
        pl.train(model, PLAN, method="gpipe", data=data, loss_fn=sum_loss, optimizer=sgd, steps=1,
                 microbatches=M, backend="local", progress=False, measure_memory=1)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_peak_is_the_allocators() -> None:
    """On CUDA worker processes the peak is torch.cuda.max_memory_allocated: at least what the storage
    count saw (weights, gradients, momentum, activations), since the allocator sees every tensor."""
    r = _train("gpipe", backend="gloo", device="cuda")
    for w in (0, 1):
        assert r.peak_memory[w] >= r.peak_state[w] > 0

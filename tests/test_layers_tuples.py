"""Layers of models whose modules return tuples (``nn.LSTM``: ``(out, (h, c))``).

A layer is a node together with the getitems unpacking its tuple output
(:func:`pipelab.graph.layer_members`), so no cut falls between an LSTM and its unpacking
and only tensors cross cuts. Oracles: the eager model (chaining every single-layer stage must give
its output bit for bit), what each stage really sends (the profiler's cut bytes), plain
single-process training (a pipelined GNMT run cut right after an LSTM).
"""

from __future__ import annotations

import functools
import operator
from typing import Any

import pytest
import torch
from torch import nn

import pipelab as pl
from pipelab.graph import (
    build_stage,
    layer_members,
    layer_nodes,
    live_across_cuts,
    tensor_bytes,
    trace,
)
from pipelab.models import gnmt, synthetic_translation
from pipelab.runtime.comm import boundary_specs
from reproductions.pipedream_table1.measure import cross_entropy, random_batches

pytestmark = pytest.mark.timeout(120)


def _tiny_gnmt() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    model = gnmt(num_layers=8, vocab=50, hidden=16).eval()
    src, tgt_in, _ = synthetic_translation(3, vocab=50, src_len=5, min_len=2)
    return model, (src, tgt_in)


def _chain(gm: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Run the model as one stage per layer, each handing its live values to the next."""
    vals: tuple[torch.Tensor, ...] = inputs
    n = len(layer_nodes(gm))
    with torch.no_grad():
        for i in range(n):
            out = build_stage(gm, i, i + 1)(*vals)
            if i < n - 1:
                assert isinstance(out, tuple) and all(isinstance(v, torch.Tensor) for v in out), i
                vals = out
    return out


def test_gnmt_layers_group_lstms_with_their_getitems_and_only_tensors_cross_cuts() -> None:
    model, x = _tiny_gnmt()
    gm = trace(model)
    members = layer_members(gm)
    heads = layer_nodes(gm)
    assert [g[0] for g in members] == heads
    # every LSTM layer holds its module and the getitem taking `out` from `(out, (h, c))`
    lstms = [
        g
        for g in members
        if g[0].op == "call_module" and isinstance(gm.get_submodule(str(g[0].target)), nn.LSTM)
    ]
    assert len(lstms) == 8
    for g in lstms:
        assert len(g) == 2 and g[1].target is operator.getitem and g[1].args == (g[0], 0)
    # no getitem is a layer of its own, and every layer node is in exactly one layer
    assert not any(h.target is operator.getitem for h in heads)
    all_layer_nodes = [n for n in gm.graph.nodes if n.op in ("call_module", "call_function", "call_method")]
    assert sorted(n.name for g in members for n in g) == sorted(n.name for n in all_layer_nodes)
    # at every boundary, every live value is a tensor (boundary_specs raises otherwise)
    n = len(heads)
    specs = boundary_specs(gm, x, [(i, i + 1) for i in range(n)])
    cuts = live_across_cuts(gm)
    assert [len(s) for s in specs] == [len(c) for c in cuts] and len(cuts) == n - 1
    # ... and chaining all single-layer stages reproduces the model exactly
    with torch.no_grad():
        expected = model(*x)
    assert torch.equal(_chain(gm, x), expected)


def test_gnmt_profile_cut_bytes_equal_what_every_stage_sends() -> None:
    model, x = _tiny_gnmt()
    gm = trace(model)
    prof = pl.profile(model, x, warmup=0, repeats=1, progress=False)
    assert len(prof) == len(layer_nodes(gm))
    for i in range(len(prof) - 1):
        with torch.no_grad():
            sent = build_stage(gm, 0, i + 1)(*x)
        assert tensor_bytes(sent) == prof.cut_bytes[i], (i, prof.names[i])
    # an LSTM layer hands on its output sequence only ([B, S, H] floats; 2H for the bidirectional
    # one), not the final states nobody uses
    b, s = x[0].shape
    t = x[1].shape[1]
    assert prof.layers[prof.names.index("encoder.0")].out_bytes == b * s * 2 * 16 * 4
    assert prof.layers[prof.names.index("encoder.1")].out_bytes == b * s * 16 * 4
    assert prof.layers[prof.names.index("att_rnn")].out_bytes == b * t * 16 * 4
    assert all(a < c for a, c in prof.edges)


class _Late(nn.Module):
    """Unpacks the LSTM's tuple in pieces, the second after another layer: ``r[1][0][-1]``."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, num_layers=2, batch_first=True)
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.lstm(x)
        a = self.lin(r[0])
        h = r[1][0]
        return a.sum(1) + h[-1]


def test_getitems_later_in_the_graph_join_their_producer() -> None:
    torch.manual_seed(0)
    model, x = _Late().eval(), torch.randn(2, 5, 3)
    gm = trace(model)
    members = layer_members(gm)
    assert [len(g) for g in members] == [5, 1, 1, 1]   # lstm + r[0], r[1], r[1][0], h[-1]; lin; sum; add
    assert gm.graph.find_nodes(op="call_module", target="lin")[0] == members[1][0]
    cuts = live_across_cuts(gm)
    # after the LSTM layer: r[0] for lin and h[-1] for the final add, never the tuple
    assert cuts[0] == [members[0][1].name, members[0][4].name]
    with torch.no_grad():
        assert torch.equal(_chain(gm, (x,)), model(x))
    prof = pl.profile(model, x, warmup=0, repeats=1, progress=False)
    assert prof.layers[0].out_bytes == (2 * 5 * 4 + 2 * 4) * 4 == prof.cut_bytes[0]
    assert prof.edges == ((0, 1), (0, 3), (1, 2), (2, 3))


class _Two(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, x + 1


class _Both(nn.Module):
    def forward(self, t: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return t[0] * t[1]


class _WholeTuple(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.two, self.both = _Two(), _Both()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.both(self.two(x))


def test_a_tuple_taken_whole_by_a_later_layer_cannot_cross_a_cut_and_the_error_says_what_to_do() -> None:
    gm = trace(_WholeTuple(), leaf_modules=[_Two, _Both])
    assert len(layer_nodes(gm)) == 2
    with pytest.raises(
        TypeError,
        match=r"'two' \(a tuple\) crosses the cut after layer 0.*produced by layer 0 "
        r"\(module 'two'\) and used whole by layer 1 \(module 'both'\).*leaf_modules",
    ):
        boundary_specs(gm, (torch.randn(2, 3),), [(0, 1), (1, 2)])


# ----------------------------------------------------------------------------- a pipelined GNMT run

STEPS, BATCH, SEQ, VOCAB = 3, 4, 5, 50
_model_fn = functools.partial(gnmt, 8, VOCAB, 16, dropout=0.0)
_data = functools.partial(random_batches, "gnmt8", steps=STEPS, batch=BATCH, seq_len=SEQ, vocab=VOCAB)
_opt = functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9)


def _plain_training() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model = _model_fn()
    opt = _opt(model.parameters())
    for x, y in _data():
        opt.zero_grad()
        cross_entropy(model(*x), y).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_gnmt_cut_right_after_lstms_trains_across_processes_as_plain_training() -> None:
    gm = trace(_model_fn())
    heads = layer_nodes(gm)
    n = len(heads)
    after = {str(h.target): i + 1 for i, h in enumerate(heads) if h.op == "call_module"}
    # cuts right after the bidirectional encoder LSTM and after the attention LSTM, whose tuple
    # output used to cross the cut the partitioner chose
    plan = pl.Plan.from_boundaries(n, [after["encoder.0"], after["att_rnn"]])

    def run(backend: str) -> Any:
        return pl.train(
            _model_fn,
            plan,
            method="1f1b-flush",
            data=_data,
            loss_fn=cross_entropy,
            optimizer=_opt,
            steps=STEPS,
            microbatches=2,
            backend=backend,
            progress=False,
            timeout=120,
        )

    res, local = run("gloo"), run("local")
    ref = _plain_training()

    def diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        assert a.keys() == b.keys()
        return max(float((a[k] - b[k]).abs().max()) for k in a)

    assert diff(res.state_dict(), ref) < 1e-5
    assert diff(res.state_dict(), local.state_dict()) < 1e-5
    torch.manual_seed(0)
    assert diff(res.state_dict(), _model_fn().state_dict()) > 1e-3  # it did train (same seed, same init)
    assert res.losses == pytest.approx(local.losses, abs=1e-5)

"""The tag-blind transport (``PIPELAB_P2P_MATCH=order``): every message goes with tag 0, so gloo matches
purely in posting order per pair of workers, as NCCL does. Every method (with its options: replicated
stages, interleaved hand-offs, vertical sync, 2BW, buffered, PipeMare, HetPipe, drained segments)
trains to bit-identical weights (``torch.equal``) on it and on the tagged path; every send and posted
receive is checked against the schedule's per-pair sequence on the way. A reordered schedule is
refused with the validator's error before any process starts.

Run the whole multi-process suite tag-blind with ``PIPELAB_P2P_MATCH=order pytest tests/test_runtime_mp.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
import test_runtime_async_helpers as A
import test_runtime_helpers as H
import torch
from test_message_order import reordered_gpipe

import pipelab as pl
from pipelab.runtime.comm import DistComm, OrderError, Recv, Send, TensorSpec, peer_orders
from pipelab.schedules import ScheduleError

PAIR_L = 14

# (method, cuts, replicas, options, model, microbatches, steps)
CASES: list[tuple[str, list[int], list[int], dict[str, Any], str, int, int]] = [
    ("dp", [], [2], {}, "pair", 4, 3),
    ("gpipe", [5, 9], [2, 1, 1], {}, "pair", 4, 3),
    ("1f1b-flush", [6], [1, 2], {}, "pair", 4, 3),
    ("interleaved-1f1b", [3, 7, 10], [1, 1, 1, 1], {"chunks": 2}, "pair", 4, 3),
    ("zb-h1", [3, 6, 10], [1, 1, 1, 1], {}, "pair", 4, 3),
    ("zb-h2", [4, 9], [1, 1, 1], {}, "pair", 4, 3),
    ("zb-v", [3, 6, 10], [1, 1, 1, 1], {}, "pair", 4, 3),
    ("dualpipe", [3, 6, 10], [1, 1, 1, 1], {}, "pair", 8, 2),
    ("dualpipev", [3, 6, 10], [1, 1, 1, 1], {}, "pair", 4, 3),
    ("pipedream", [6], [2, 1], {}, "pair", 1, 8),
    ("pipedream", [4, 9], [1, 1, 1], {"vertical_sync": True, "drain_every": 4}, "pair", 1, 8),
    ("naive-async", [7], [1, 1], {"extra_in_flight": 1}, "pair", 1, 8),
    ("pipemare", [4, 9], [1, 1, 1], {"warmup_steps": 4}, "pair", 1, 8),
    ("2bw", [7], [1, 1], {}, "pair", 2, 6),
    ("buffered", [4, 9], [1, 1, 1], {"versions": 3}, "pair", 2, 6),
    ("hetpipe", [2], [2, 2], {"D": 0}, "mlp5", 1, 8),
]
MODELS = {"pair": (H.pair, H.pair_data, H.loss_fn, PAIR_L), "mlp5": (A.mlp, A.data, A.loss_fn, 5)}


def _train(case: tuple[Any, ...], backend: str = "gloo") -> Any:
    method, cuts, reps, opts, model, M, steps = case
    model_fn, data, loss_fn, n_layers = MODELS[model]
    plan = pl.Plan.from_boundaries(n_layers, cuts, reps)
    gloo_p2p = {"shared_memory": False} if backend == "gloo" else {}   # gloo's own point-to-point path
    return pl.train(model_fn, plan, method=method, data=data, loss_fn=loss_fn, optimizer=H.sgd, steps=steps,
                    microbatches=M, backend=backend, progress=False, timeout=150, **opts, **gloo_p2p)


def test_every_method_is_covered() -> None:
    assert {c[0] for c in CASES} == set(pl.methods.names())


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_tag_blind_transport_gives_bit_identical_weights(case: tuple[Any, ...],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_P2P_MATCH", "tag")
    tagged = _train(case)
    monkeypatch.setenv("PIPELAB_P2P_MATCH", "order")
    blind = _train(case)
    a, b = tagged.state_dict(), blind.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), case
    assert tagged.losses == blind.losses
    assert blind.trace.actions_by_worker() == {w: [str(x) for x in acts]
                                               for w, acts in enumerate(blind.schedule.actions)}
    sent = sum(e.bytes for e in blind.trace.compute_events() if e.kind in "FB")
    assert sent > 0 or case[0] == "dp"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_reordered_schedule_fails_with_the_validators_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_P2P_MATCH", "order")
    bad = reordered_gpipe()
    plan = pl.Plan.from_boundaries(5, [2])
    for backend in ("gloo", "local"):
        with pytest.raises(ScheduleError, match="per-pair message order: worker 0 sends to worker 1"):
            pl.train(H.mlp, plan, data=H.mlp_data, loss_fn=H.loss_fn, optimizer=H.sgd, steps=1,
                     microbatches=2, backend=backend, schedule=bad, progress=False, timeout=60)


def test_order_mode_checks_every_send_and_receive_against_the_schedule() -> None:
    """No process group is needed: the check runs before anything goes on the wire."""
    sch = pl.schedules.build("gpipe", 2, microbatches=2, minibatches=1)
    orders = peer_orders(sch, 0)
    assert orders == ({1: [0, 2]}, {1: [1, 3]})   # acts of 0F0, 0F1; grads of 1B0, 1B1 (tags)
    comm = DistComm(0, torch.device("cpu"), {}, match="order", orders=orders)
    with pytest.raises(OrderError, match="message #0 of its send to worker 1 has tag 2 but the schedule"):
        comm.send(Send(1, 2, [torch.zeros(1)]))
    with pytest.raises(OrderError, match="receive from worker 1 has tag 3"):
        comm.post(Recv(1, 3, [TensorSpec((1,), "float32")]))
    with pytest.raises(ValueError, match="needs orders="):
        DistComm(0, torch.device("cpu"), {}, match="order")
    with pytest.raises(ValueError, match="match='nope'"):
        DistComm(0, torch.device("cpu"), {}, match="nope")


def test_a_bad_matching_mode_is_refused_before_any_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_P2P_MATCH", "bogus")
    with pytest.raises(ValueError, match=r"PIPELAB_P2P_MATCH='bogus'; use one of \('tag', 'order'\)"):
        pl.train(H.mlp, pl.Plan.from_boundaries(5, [2]), method="gpipe", data=H.mlp_data, loss_fn=H.loss_fn,
                 optimizer=H.sgd, steps=1, microbatches=2, backend="gloo", progress=False, timeout=60)

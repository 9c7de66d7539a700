"""Point-to-point messages through shared memory (the default on one host, :mod:`pipelab.runtime.shm`):
the same weights bit for bit as over gloo's point-to-point path (the oracle), for flushed, interleaved
(hand-offs inside a worker), replicated and asynchronous schedules, tagged and tag-blind; a ring that
reuses a slot only once its message was consumed, and a read of the wrong size consumes nothing; rings
only on one host with room for them; bad input is refused before a process starts."""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any

import pytest
import test_runtime_helpers as H
import torch

import pipelab as pl
from pipelab.runtime import shm
from pipelab.runtime.comm import TensorSpec
from pipelab.runtime.options import RuntimeOptions

pytestmark = pytest.mark.skipif(not shm.available("gloo"), reason="shared-memory messages need x86-64 Linux")

CASES: list[tuple[str, list[int], list[int], dict[str, Any], int, int]] = [
    ("1f1b-flush", [6], [1, 1], {}, 4, 2),
    ("interleaved-1f1b", [3, 7, 10], [1, 1, 1, 1], {"chunks": 2}, 4, 2),
    ("gpipe", [5], [2, 1], {}, 4, 2),
    ("pipedream", [6], [1, 1], {}, 1, 6),
]


def _train(case: tuple[Any, ...], **opts: Any) -> Any:
    method, cuts, reps, extra, m, steps = case
    plan = pl.Plan.from_boundaries(14, cuts, reps)
    return pl.train(H.pair, plan, method=method, data=H.pair_data, loss_fn=H.loss_fn, optimizer=H.sgd,
                    steps=steps, microbatches=m, progress=False, timeout=120, **extra, **opts)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_shared_memory_trains_the_weights_gloo_trains(case: tuple[Any, ...],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIPELAB_P2P_MATCH", "order" if case[0] == "pipedream" else "tag")
    over_gloo = _train(case, shared_memory=False)
    over_shm = _train(case)      # the default on one host with CPU stages
    a, b = over_gloo.state_dict(), over_shm.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), case
    assert over_gloo.losses == over_shm.losses
    assert (over_gloo.transport, over_shm.transport) == ("gloo", "shared memory")
    assert "(gloo, messages through shared memory)" in over_shm.describe()
    assert sum(e.bytes for e in over_shm.trace.compute_events() if e.kind in "FB") > 0


def test_a_slot_is_reused_only_once_its_message_was_consumed() -> None:
    """Two rings in one process stand for the two ends: slot reuse waits for the consumer."""
    path = tempfile.mktemp(prefix="pipelab-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    recv_end = shm._Ring(path, create=(2, 64))
    send_end = shm._Ring(path)
    os.unlink(path)
    assert (send_end.k, send_end.slot) == (2, 64)
    for k in range(2):
        send_end.write(k, 10 + k, torch.full((4,), float(k)))
    assert send_end.consumed() == 0            # message 2 would overwrite message 0: not yet
    out = torch.empty(4)
    assert recv_end.stamp(0) == 1 and recv_end.read(0, out) == (10, 16)
    assert torch.equal(out, torch.zeros(4)) and send_end.consumed() == 1
    send_end.write(2, 12, torch.full((4,), 2.0))
    assert recv_end.read(1, out) == (11, 16) and torch.equal(out, torch.ones(4))
    assert recv_end.read(2, torch.empty(2)) == (12, 16)   # a size mismatch is not consumed
    assert recv_end.consumed() == 2


@pytest.mark.parametrize(("seen", "why"), [
    ([("a", 1 << 20, 64 << 20), ("a", 1 << 20, 64 << 20)], None),
    ([("a", 1 << 20, 64 << 20), ("b", 1 << 20, 64 << 20)], "several hosts"),
    ([("a", 20 << 20, 64 << 20), ("a", 20 << 20, 64 << 20)], "rings need 40.0 MiB and .* 64.0 MiB free"),
])
def test_rings_only_on_one_host_with_room_for_them(monkeypatch: pytest.MonkeyPatch, seen: list[Any],
                                                   why: str | None) -> None:
    def gather(out: list[Any], _mine: Any) -> None:
        out[:] = seen

    monkeypatch.setattr(shm.dist, "all_gather_object", gather)
    got = shm.unusable(2, 0)
    assert got is None if why is None else (got is not None and re.search(why, got))


def test_ring_bytes_follow_the_slot_layout() -> None:
    f32 = lambda *shape: TensorSpec(shape, "float32")   # noqa: E731
    msgs = [[f32(4, 8)], [f32(4, 8), f32(3)]]        # 128 B; 128 + 16 B packed: slots of 192 B
    assert shm.ring_shape(msgs) == (2, 192)
    assert shm.ring_bytes({1: msgs, 2: [[f32(1)]] * 100}) == (shm.HEADER + 2 * (shm.SLOT_HEADER + 192)
                                                              + shm.HEADER + 64 * (shm.SLOT_HEADER + 64))


def test_bad_shared_memory_input_is_refused_before_any_process_starts() -> None:
    assert RuntimeOptions.from_options("gpipe", {"shared_memory": True}).shared_memory is True
    assert RuntimeOptions.from_options("gpipe", {}).shared_memory is None
    with pytest.raises(ValueError, match="shared_memory='yes' must be True or False"):
        RuntimeOptions.from_options("gpipe", {"shared_memory": "yes"})

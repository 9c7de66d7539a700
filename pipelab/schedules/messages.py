"""The messages of a schedule, per ordered pair of workers, in the order each side handles them.

Every ``F`` of stage ``s < S-1`` sends its activation to the worker of ``F`` of ``s+1``, every ``B``
of ``s > 0`` its gradient to the worker of ``B`` of ``s-1``; a hand-off on one worker is no message.
NCCL ignores tags and MPI matches in order, so a schedule runs on them only when, for every pair,
the sender's and the receiver's sequences agree (:func:`first_mismatch` finds where they do not).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelab.schedules.actions import Action, Schedule


@dataclass(frozen=True, order=True)
class Message:
    """One point-to-point message: the activation (``kind="act"``) of ``F`` of ``stage`` for
    ``microbatch``, or the gradient (``kind="grad"``) of ``B`` of ``stage``."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        verb = "F" if self.kind == "act" else "B"
        return f"{self.kind} of {self.stage}{verb}{self.microbatch}"


@dataclass(frozen=True)
class PairSequence:
    """The messages from ``src`` to ``dst``: ``sent`` in ``src``'s order, ``received`` in ``dst``'s,
    each with the index of the action that sends (``send_at``) or needs (``recv_at``) it."""

    src: int
    dst: int
    sent: tuple[Message, ...]
    send_at: tuple[int, ...]
    received: tuple[Message, ...]
    recv_at: tuple[int, ...]


def sent_by(schedule: Schedule, worker: int, a: Action) -> tuple[int, Message] | None:
    """``(destination worker, message)`` that action ``a`` of ``worker`` sends, or None (no message,
    or a hand-off to another stage of the same worker)."""
    last = schedule.num_stages - 1
    s, m = a.stage, a.microbatch
    if a.kind == "F" and s < last:
        dst = schedule.worker_of(s + 1, m)
    elif a.kind == "B" and s > 0:
        dst = schedule.worker_of(s - 1, m)
    else:
        return None
    return None if dst == worker else (dst, Message("act" if a.kind == "F" else "grad", s, m))


def received_by(schedule: Schedule, worker: int, a: Action) -> tuple[int, Message] | None:
    """``(source worker, message)`` that action ``a`` of ``worker`` needs from another worker, or None."""
    last = schedule.num_stages - 1
    s, m = a.stage, a.microbatch
    if a.kind == "F" and s > 0:
        src, msg = schedule.worker_of(s - 1, m), Message("act", s - 1, m)
    elif a.kind == "B" and s < last:
        src, msg = schedule.worker_of(s + 1, m), Message("grad", s + 1, m)
    else:
        return None
    return None if src == worker else (src, msg)


def pair_sequences(schedule: Schedule) -> dict[tuple[int, int], PairSequence]:
    """For every ordered pair ``(src, dst)`` that exchanges messages, both sides' sequences."""
    sent: dict[tuple[int, int], list[tuple[Message, int]]] = {}
    recv: dict[tuple[int, int], list[tuple[Message, int]]] = {}
    for w, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            out = sent_by(schedule, w, a)
            if out is not None:
                sent.setdefault((w, out[0]), []).append((out[1], i))
            inc = received_by(schedule, w, a)
            if inc is not None:
                recv.setdefault((inc[0], w), []).append((inc[1], i))
    pairs: dict[tuple[int, int], PairSequence] = {}
    for key in sorted(set(sent) | set(recv)):
        s_list, r_list = sent.get(key, []), recv.get(key, [])
        pairs[key] = PairSequence(key[0], key[1], tuple(x for x, _ in s_list), tuple(i for _, i in s_list),
                                  tuple(x for x, _ in r_list), tuple(i for _, i in r_list))
    return pairs


def first_mismatch(seq: PairSequence) -> int | None:
    """The first position where the two sides of ``seq`` disagree (or where one side ends), else None."""
    for k, (a, b) in enumerate(zip(seq.sent, seq.received)):
        if a != b:
            return k
    if len(seq.sent) != len(seq.received):
        return min(len(seq.sent), len(seq.received))
    return None


def describe_mismatch(seq: PairSequence, k: int, context: int = 4) -> str:
    """Why in-order matching breaks on pair ``seq`` at position ``k``, naming both sequences."""
    lo = max(0, k - 1)

    def show(xs: tuple[Message, ...]) -> str:
        part = ", ".join(str(x) for x in xs[lo:k + context])
        return ("..., " if lo else "") + part + (", ..." if len(xs) > k + context else "")

    got = str(seq.sent[k]) if k < len(seq.sent) else "nothing (the sender has no more messages)"
    want = str(seq.received[k]) if k < len(seq.received) else "nothing (the receiver takes no more)"
    return (f"per-pair message order: worker {seq.src} sends to worker {seq.dst} in the order "
            f"[{show(seq.sent)}] but worker {seq.dst} receives from worker {seq.src} in the order "
            f"[{show(seq.received)}]; "
            f"in-order matching (NCCL and MPI ignore or do not reorder by tags) would hand message #{k} "
            f"({got}) to the receive for {want}: wrong data, or a hang. Order both workers' actions so that "
            f"they handle the messages between them in one sequence")

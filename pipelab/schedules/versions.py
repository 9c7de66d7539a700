"""Weight versions: the rule of each method's schedule for which version every action reads.

:attr:`pipelab.methods.Method.versions` names the rule (:data:`VERSION_RULES`);
:func:`assign_versions` applies it when a builder makes a schedule, and the runtime's weight policies
keep exactly the versions the schedule then names. :func:`delayed_rule` is the delayed rule's
closed form, also the oracle of the runtime's delayed policies.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.schedules.actions import Action

#: the version rules :func:`assign_versions` knows (``"vertical"``: ``"stash"`` with vertical sync)
VERSION_RULES = ("single", "stash", "vertical", "latest", "delay")


def delayed_rule(minibatch: int, delay: int, segments: Sequence[int] | None = None) -> int:
    """Version minibatch ``k`` reads under the delayed rule: ``max(k0, k - delay)``.

    ``k0`` is the first minibatch of ``k``'s drained segment (0 without ``segments``, see
    :mod:`pipelab.schedules.segments`): after a drain the pipeline restarts like a fresh one, from
    the version the drain left (one update per minibatch, so version ``k0``).
    """
    start = 0
    for s in segments or ():
        if minibatch < start + int(s):
            break
        start += int(s)
    return max(start, minibatch - delay)


def assign_versions(
    rule: str,
    actions: Sequence[Sequence[Action]],
    stage_ranks: Sequence[Sequence[int]],
    M: int,
    delay: int = 0,
    segments: Sequence[int] | None = None,
) -> tuple[tuple[int, ...], ...]:
    """The weight version each action reads (F, B, W) or produces (U), by rule.

    - ``"stash"`` (PipeDream, SOSP'19 §3.3 weight stashing): ``F`` reads the latest version on
      its worker; ``B``/``W`` read the version their microbatch's ``F`` read on that stage.
    - ``"vertical"`` (PipeDream vertical sync): every stage's ``F``/``B``/``W`` of microbatch ``m``
      read the version the input stage's ``F`` of ``m`` read.
    - ``"latest"`` (naive async, PipeMare): ``F``, ``B`` and ``W`` read the latest version when
      they run.
    - ``"delay"`` (2BW: ``delay=1``, Narayanan et al., ICML'21, §3; ``buffered`` K: ``delay=K-1``):
      minibatch ``k`` reads version ``max(0, k - delay)`` on every stage; a drained segment starting
      at ``k0`` restarts from ``max(k0, k - delay)`` (:func:`delayed_rule`).
    - ``"single"``: everything reads version 0 except that ``U`` still counts (sync methods).

    ``U`` always produces the number of ``U``'s of that stage so far on the worker.
    """
    input_version: dict[int, int] = {}
    # workers of the input stage first: vertical sync needs the input stage's versions
    order = sorted(range(len(actions)), key=lambda w: 0 if w in stage_ranks[0] else 1)
    per_worker: dict[int, tuple[int, ...]] = {}
    for w in order:
        latest: dict[int, int] = {}
        f_read: dict[tuple[int, int], int] = {}
        vs: list[int] = []
        for a in actions[w]:
            cur = latest.get(a.stage, 0)
            if a.kind == "U":
                latest[a.stage] = cur + 1
                vs.append(cur + 1)
                continue
            if rule == "single":
                v = 0
            elif rule == "latest":
                v = cur
            elif rule == "delay":
                v = delayed_rule(a.microbatch // M, delay, segments)
            elif a.kind == "F":
                if rule == "vertical" and a.stage != 0:
                    v = input_version.get(a.microbatch, cur)
                else:
                    v = cur
            else:
                v = f_read.get((a.stage, a.microbatch), cur)
            if a.kind == "F":
                f_read[(a.stage, a.microbatch)] = v
                if a.stage == 0:
                    input_version[a.microbatch] = v
            vs.append(v)
        per_worker[w] = tuple(vs)
    return tuple(per_worker[w] for w in range(len(actions)))

"""Weight versions: the rule of each method's schedule for which version every action reads.

:attr:`pipelab.methods.Method.versions` names the rule (:data:`VERSION_RULES`, docs/schedules.md);
:func:`assign_versions` applies it when a builder makes a schedule, and the runtime's weight policies
keep exactly those versions.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.schedules.actions import Action

#: the version rules :func:`assign_versions` knows (``"vertical"``: ``"stash"`` with vertical sync)
VERSION_RULES = ("single", "stash", "vertical", "latest", "delay")


def delayed_rule(minibatch: int, delay: int, segments: Sequence[int] | None = None) -> int:
    """Version minibatch ``k`` reads under the delayed rule: ``max(k0, k - delay)``, ``k0`` the first
    minibatch of its drained segment (0 without ``segments``)."""
    start = 0
    for s in segments or ():
        if minibatch < start + int(s):
            break
        start += int(s)
    return max(start, minibatch - delay)


def assign_versions(rule: str, actions: Sequence[Sequence[Action]], stage_ranks: Sequence[Sequence[int]],
                    M: int, delay: int = 0, segments: Sequence[int] | None = None
                    ) -> tuple[tuple[int, ...], ...]:
    """The weight version each action reads (F, B, W) or produces (U: the stage's ``U``'s so far on the
    worker) under ``rule``: ``"stash"``, ``"vertical"``, ``"latest"``, ``"delay"`` or ``"single"``."""
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
                v = input_version.get(a.microbatch, cur) if rule == "vertical" and a.stage != 0 else cur
            else:
                v = f_read.get((a.stage, a.microbatch), cur)
            if a.kind == "F":
                f_read[(a.stage, a.microbatch)] = v
                if a.stage == 0:
                    input_version[a.microbatch] = v
            vs.append(v)
        per_worker[w] = tuple(vs)
    return tuple(per_worker[w] for w in range(len(actions)))

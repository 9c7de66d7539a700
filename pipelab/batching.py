"""A minibatch split into microbatches: the one default count ``M`` and the one divisibility check,
which every entry point taking a microbatch count uses. Invariant: ``M`` divides the batch ``B``."""

from __future__ import annotations


def default_microbatches(stages: int, *, replicas: int = 1, workers: int | None = None,
                         data_parallel: bool = False) -> int:
    """``M`` when none is given: one per stage (the fewest that keep a 1F1B pipeline busy), at least one
    per replica of the most replicated stage (data parallelism: one per worker)."""
    n = workers if data_parallel and workers else max(stages, replicas)
    return max(1, int(n))


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order."""
    return [d for d in range(1, n + 1) if n % d == 0] if n >= 1 else []


def check_divides(batch: int, microbatches: int) -> None:
    """Raise ``ValueError`` unless ``microbatches`` is an int >= 1 that divides ``batch`` samples."""
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise ValueError(f"microbatches={microbatches!r} must be an int >= 1")
    if batch >= 1 and batch % microbatches:
        near = [str(d) for d in divisors(batch) if d > 1]
        listed = ", ".join(near[:8]) + (", ..." if len(near) > 8 else "")
        raise ValueError(f"a minibatch of {batch} samples does not split into microbatches={microbatches} "
                         f"equal parts; use a divisor of {batch} ({listed}) or change the batch size")

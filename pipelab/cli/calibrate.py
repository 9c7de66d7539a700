"""``pipelab calibrate -o cluster.json [--workers N] [--backend gloo] [--repeats R]``: measure this machine.

Writes a calibrated cluster (:func:`pipelab.calibrate.calibrate`), atomically, and prints what was
measured with its spread. ``pipelab plan|simulate --cluster cluster.json`` use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.cli._common import Parser, fail

PROG = "pipelab calibrate"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pipelab calibrate``; returns the exit code."""
    p = Parser(prog=PROG, description=(
        "Measure this machine for the cost model (links between worker processes, the runtime's own "
        "work, the optimizer step; 40-70 s with 2 workers on a shared 2-core machine) and write it as "
        "a cluster JSON for --cluster."))
    p.add_argument(
        "-o", "--output", required=True, metavar="JSON", help="where to write the calibrated cluster"
    )
    p.add_argument(
        "--workers", type=int, default=2, help="worker processes (all-reduce groups 2..N; default 2)"
    )
    p.add_argument("--backend", default="gloo", help="process-group backend to calibrate (default gloo)")
    p.add_argument("--repeats", type=int, default=5, help="rounds of every measurement (default 5)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    # torch is heavy: imported only when the command runs (keeps `pipelab --help` fast)
    from pipelab.calibrate import calibrate

    try:
        cluster = calibrate(
            workers=args.workers,
            backend=args.backend,
            repeats=args.repeats,
            path=args.output,
            progress=not args.quiet,
        )
    except (ValueError, RuntimeError) as exc:
        return fail(PROG, exc)
    cal = cluster.calibration
    assert cal is not None
    print(cal.describe())
    worst = max(cal.spread.items(), key=lambda kv: kv[1]) if cal.spread else ("", 0.0)
    print(
        f"  spread between rounds: largest {worst[1]:.0%} ({worst[0]}); fit residuals: "
        + ", ".join(f"{k} {v:.0%}" for k, v in cal.residual.items())
    )
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

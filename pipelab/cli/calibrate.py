"""``pipelab calibrate -o cluster.json``: measure this machine into a cluster for ``--cluster``."""

from __future__ import annotations

from collections.abc import Sequence

from pipelab.cli._common import Parser, fail

PROG = "pipelab calibrate"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pipelab calibrate``; returns the exit code."""
    p = Parser(prog=PROG, description=(
        "Measure this machine for the cost model (links between worker processes, the runtime's own "
        "work, the optimizer step; about a minute with 2 workers) and write it as a cluster JSON for "
        "--cluster."))
    p.add_argument("-o", "--output", required=True, metavar="JSON", help="the calibrated cluster's path")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--backend", default="gloo", help="process-group backend to calibrate (default gloo)")
    p.add_argument("--repeats", type=int, default=5, help="rounds of every measurement (default 5)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    from pipelab.calibrate import calibrate

    try:
        cluster = calibrate(workers=args.workers, backend=args.backend, repeats=args.repeats,
                            path=args.output, progress=not args.quiet)
    except (ValueError, RuntimeError) as exc:
        return fail(PROG, exc)
    cal = cluster.calibration
    assert cal is not None
    print(cal.describe())
    worst = max(cal.spread.items(), key=lambda kv: kv[1]) if cal.spread else ("", 0.0)
    print(f"  spread between rounds: largest {worst[1]:.0%} ({worst[0]}); fit residuals: "
          + ", ".join(f"{k} {v:.0%}" for k, v in cal.residual.items()))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``pipelab reproduce`` (and ``make reproduce``): the papers' reproductions, starting with the quickstart.

For now this runs the quickstart: profile VGG-16 layer by layer on this CPU at a small image size
and print the profile table, beside PipeDream's own VGG-16 profile (measured on a V100 at
minibatch 128, 224x224 images) for comparison of the per-layer shape of the costs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def quickstart(*, image_size: int = 64, batch: int = 4, repeats: int = 3, device: str = "cpu",
               progress: bool = True) -> int:
    """Profile VGG-16 (no weights needed) and print its table and PipeDream's; returns 0."""
    from pipelab.models import example, pipedream_profile
    from pipelab.profile.cli import show
    from pipelab.profile.measure import profile

    model, sample = example("vgg16", batch, image_size=image_size)
    prof = profile(model, sample, device=device, repeats=repeats, progress=progress, model_name="vgg16")
    print(f"== VGG-16 measured here: batch {batch}, {image_size}x{image_size} images, {device} ==")
    show(prof)
    ref = pipedream_profile("vgg16")
    print(f"\n== PipeDream's VGG-16 profile (shipped; batch {ref.batch_size}, 224x224, V100) ==")
    print(repr(ref))
    here = prof.totals(0, len(prof))
    print(f"\nbackward/forward time ratio: here {here.bwd_s / here.fwd_s:.2f}, "
          f"PipeDream {ref.bwd_s / ref.fwd_s:.2f}; parameters {prof.param_bytes / 4:,.0f} (expected 138,357,544)")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pipelab reproduce``."""
    p = argparse.ArgumentParser(prog="pipelab reproduce", description="run pipelab's reproductions "
                                "(currently: the quickstart profile of VGG-16)")
    p.add_argument("--image-size", type=int, default=64, help="image side for the quickstart (default 64)")
    p.add_argument("--batch", type=int, default=4, help="minibatch for the quickstart (default 4)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per layer (default 3)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        return quickstart(image_size=args.image_size, batch=args.batch, repeats=args.repeats,
                          device=args.device, progress=not args.quiet)
    except (ValueError, TypeError) as exc:
        print(f"pipelab reproduce: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""``pipelab profile``: measure a model (your own or the zoo's), import a PipeDream graph.txt, or show one.

    pipelab profile --model mymodels:make_model --input-shape 8,3,32,32 -o mine.json
    pipelab profile --model vgg16 --batch 32 --image-size 64 --device cpu -o vgg16.json
    pipelab profile --show vgg16.json
    pipelab profile --pipedream vgg16 -o vgg16_pipedream.json     (a shipped name or a graph.txt path)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from pipelab.cli._common import Parser, add_model_input, fail, is_callable_ref, profile_callable, suggest
from pipelab.profile.pipedream_format import load_pipedream
from pipelab.profile.records import Profile

PROG = "pipelab profile"


def _parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description="Profile a model layer by layer (your own as package.module:function, "
                                      "or one of the zoo's), import a PipeDream graph.txt, or show a saved "
                                      "profile.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", metavar="MODEL",
                     help="package.module:function returning an nn.Module (with --input-shape; the current "
                          "directory is on the import path), or a zoo name: vgg16, resnet50, gnmt8, gnmt16, "
                          "tiny_transformer, small_cnn, ...")
    src.add_argument("--show", metavar="JSON", help="print the table of a saved profile")
    src.add_argument("--pipedream", metavar="NAME_OR_PATH",
                     help="import a PipeDream graph.txt (vgg16, resnet50, alexnet, gnmt8, gnmt16 or a path)")
    add_model_input(p)
    p.add_argument("--batch", type=int, default=8, help="zoo models: minibatch size to measure (default 8)")
    p.add_argument("--image-size", type=int, default=224, help="image side for vgg16/resnet50 (default 224)")
    p.add_argument("--seq-len", type=int, default=24, help="sequence length for gnmt/tiny_transformer")
    p.add_argument("--vocab", type=int, default=None, help="vocabulary size for gnmt/tiny_transformer")
    p.add_argument("--hidden", type=int, default=None, help="hidden size for gnmt (default 1024)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per layer; the median is kept")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per layer before timing")
    p.add_argument("--depth", type=int, default=None, help="treat modules this deep as single layers")
    p.add_argument("--small-batch", type=int, default=None, metavar="B",
                   help="also time every layer at batch B (e.g. the microbatch size) and record the part of "
                        "each time that does not shrink with the batch (default: a quarter of the batch; "
                        "0: skip it)")
    p.add_argument("--pipedream-batch", type=int, default=None,
                   help="override the minibatch size inferred from a graph.txt")
    p.add_argument("-o", "--output", metavar="JSON", help="save the profile here (written atomically)")
    p.add_argument("--quiet", action="store_true", help="no progress bar and no table")
    return p


def show(prof: Profile, file: TextIO | None = None) -> None:
    """Print a profile's header and per-layer table (ms, MB, GFLOP)."""
    print(repr(prof), file=file)
    print(prof.summary().to_string(float_format=lambda v: f"{v:.3f}"), file=file)
    if prof.loss_saved_bytes:
        print(f"the loss saves {prof.loss_saved_bytes / 1e6:.3f} MB for its backward (held by the last "
              "stage; its time is in the last layer's)", file=file)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``pipelab profile``; returns the exit code (2 for bad input, with a one-line reason)."""
    args = _parser().parse_args(argv)
    small = "auto" if args.small_batch is None else (args.small_batch or None)
    try:
        if args.show:
            prof = Profile.load(args.show)
        elif args.pipedream:
            prof = load_pipedream(args.pipedream, batch_size=args.pipedream_batch)
        elif is_callable_ref(args.model):
            prof = profile_callable(args.model, args.input_shape, dtype=args.input_dtype, vocab=args.vocab,
                                    progress=not args.quiet, device=args.device, warmup=args.warmup,
                                    repeats=args.repeats, depth=args.depth, small_batch=small)
        else:
            # torch-heavy: only when a model is profiled (showing a saved profile needs no torch)
            from pipelab.models import REGISTRY, example
            from pipelab.profile.measure import profile

            if args.model not in REGISTRY:
                zoo = ", ".join(sorted(REGISTRY))
                raise ValueError(f"unknown model {args.model!r}{suggest(args.model, REGISTRY)} (the zoo has "
                                 f"{zoo}); for your own write package.module:function with --input-shape "
                                 "(e.g. torchvision.models:resnet18)")
            model, sample = example(args.model, args.batch, image_size=args.image_size, seq_len=args.seq_len,
                                    vocab=args.vocab, hidden=args.hidden)
            prof = profile(model, sample, device=args.device, warmup=args.warmup, repeats=args.repeats,
                           depth=args.depth, progress=not args.quiet, model_name=args.model,
                           small_batch=small)
        if args.output:
            prof.save(args.output)
    except (ValueError, TypeError, FileNotFoundError, OSError) as exc:
        return fail(PROG, exc)
    if not args.quiet:
        show(prof)
    if args.output:
        print(f"saved {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

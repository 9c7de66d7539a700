"""What every sub-command shares: one error style, "did you mean", ``--cluster list``, your own model.

Errors read ``pipelab X: error: what was wrong; what to do`` on stderr, exit code 2 (bad input) or 1
(the job failed). A user's ``package.module:function`` imports with the current directory on the path.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn


def suggest(name: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``choices`` (case-insensitive), else ``""``."""
    lowered = {c.lower(): c for c in choices}
    if name.lower() in lowered:
        return f"; did you mean {lowered[name.lower()]!r}?"
    close = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return f"; did you mean {lowered[close[0]]!r}?" if close else ""


class Parser(argparse.ArgumentParser):
    """argparse with pipelab's error line and a "did you mean" for a near-miss choice."""

    def error(self, message: str) -> NoReturn:
        m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
        if m:
            choices = re.findall(r"'([^']*)'", m.group(2)) or [c.strip() for c in m.group(2).split(",")]
            message = f"{message}{suggest(m.group(1), choices)}"
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def fail(prog: str, message: object, code: int = 2) -> int:
    """Print ``pipelab X: error: message`` to stderr; returns ``code`` for ``main`` to return."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return code


def print_cluster_list() -> int:
    """``--cluster list``: every preset with its default size and device."""
    from pipelab.cluster import Cluster

    print("cluster presets (NAME, NAME:SERVERSxGPUS or NAME:GPUS; flat:N is N identical workers):")
    for name in Cluster.presets():
        c = Cluster.parse(name)
        devices = sorted({d.name for d in c.devices})
        links = ", ".join(f"{lv.name} {lv.bandwidth / 1e9:g} GB/s" for lv in c.levels)
        print(f"  {c.name:<20} {c.num_workers:>3} x {'/'.join(devices)}; {links}")
    print("  flat:N               N workers behind one 10 GB/s switch")
    print("  FILE.json            a calibrated cluster written by `pipelab calibrate -o FILE.json`")
    return 0


def add_profile_and_cluster(p: argparse.ArgumentParser, cluster_default: str | None = None) -> None:
    """The options ``plan`` and ``simulate`` share: profile, cluster, compression, model input."""
    p.add_argument("profile", help="profile JSON, PipeDream graph.txt, shipped name (vgg16, gnmt8, ...) or "
                                   "package.module:function with --input-shape")
    p.add_argument("--cluster", required=cluster_default is None, default=cluster_default,
                   help="cluster: a preset with its size (e.g. pipedream-a:4x4 for servers x GPUs, flat:8), "
                        "or a calibrated cluster JSON (pipelab calibrate -o me.json); --cluster list prints "
                        "the presets" + (f" (default {cluster_default})" if cluster_default else ""))
    p.add_argument("--compression", type=number_or_text, default=None,
                   help="activation compression: fp16, bf16, int8 or a ratio (default none)")
    add_model_input(p)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | None:
    """``argv`` (default ``sys.argv[1:]``) parsed, or None once ``--cluster list`` printed the presets
    (checked before required arguments are)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--cluster=list" or (a == "--cluster" and args[i + 1:i + 2] == ["list"])
           for i, a in enumerate(args)):
        print_cluster_list()
        return None
    return parser.parse_args(args)


def is_callable_ref(spec: str) -> bool:
    """Whether ``spec`` reads as ``package.module:function`` (not a path, not a plain name)."""
    return bool(re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", spec.strip()))


def import_callable(spec: str) -> Callable[..., Any]:
    """The function named ``package.module:function``, with the current directory on the import path
    (kept there, so worker processes started later import it too)."""
    if not is_callable_ref(spec):
        raise ValueError(f"{spec!r} is not a callable reference; write package.module:function "
                         "(e.g. mymodels:make_model for make_model in ./mymodels.py)")
    cwd = str(Path.cwd().resolve())
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    module_name, _, name = spec.strip().partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r} for {spec!r} ({exc}); searched {cwd} and "
                         "the installed packages") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        names = [n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n))]
        raise ValueError(f"module {module_name!r} has no function {name!r}{suggest(name, names)}")
    return fn


def input_shape(text: str) -> tuple[int, ...]:
    """``"8,3,32,32"`` as a shape; the first number is the batch."""
    try:
        shape = tuple(int(v) for v in text.replace("x", ",").split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write the input's shape as numbers, batch first, "
                                         "e.g. 8,3,32,32") from None
    if not shape or any(v < 1 for v in shape):
        raise argparse.ArgumentTypeError(f"{text!r}: every dimension must be >= 1, batch first")
    return shape


def add_model_input(p: argparse.ArgumentParser) -> None:
    """The options that build a sample input for a ``module:function`` model."""
    p.add_argument("--input-shape", type=input_shape, metavar="B,D1,...",
                   help="a module:function model's input shape, batch first (e.g. 8,3,32,32)")
    p.add_argument("--input-dtype", choices=("float32", "int64"), default="float32",
                   help="its dtype; int64 draws token ids below --vocab (default float32)")


def sample_input(shape: Sequence[int], dtype: str = "float32", vocab: int | None = None) -> Any:
    """A random input of ``shape`` (seeded), floats or token ids."""
    import torch

    g = torch.Generator().manual_seed(0)
    if dtype == "int64":
        return torch.randint(0, vocab or 1000, tuple(shape), generator=g)
    return torch.randn(tuple(shape), generator=g)


def profile_callable(spec: str, shape: Sequence[int] | None, *, dtype: str = "float32",
                     vocab: int | None = None, progress: bool = False, **kwargs: Any) -> Any:
    """Profile the model ``package.module:function()`` on a random input of ``shape``."""
    if shape is None:
        raise ValueError(f"--model {spec} needs --input-shape (batch first, e.g. 8,3,32,32) to profile it")
    from pipelab.profile.measure import profile

    model = import_callable(spec)()
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{spec}() returned a {type(model).__name__}, not a torch.nn.Module")
    return profile(model, sample_input(shape, dtype, vocab), progress=progress, model_name=spec, **kwargs)


def load_inputs(args: argparse.Namespace) -> tuple[Any, Any]:
    """The profile and cluster that :func:`add_profile_and_cluster`'s options name, with "did you mean"."""
    from pipelab.cluster import Cluster
    from pipelab.profile.records import Profile

    spec = args.profile
    if is_callable_ref(spec) and not Path(spec).exists():
        prof = profile_callable(spec, args.input_shape, dtype=args.input_dtype, progress=False)
    else:
        try:
            prof = Profile.open(spec)
        except (FileNotFoundError, ValueError) as exc:
            from pipelab.profile.pipedream_format import SHIPPED

            hint = suggest(spec, SHIPPED) if not Path(spec).suffix else ""
            raise ValueError(f"{exc}{hint}") from None
    try:
        return prof, Cluster.parse(args.cluster)
    except ValueError as exc:
        name = args.cluster.split(":")[0].strip()
        hint = suggest(name, [*Cluster.presets(), "flat"]) if not args.cluster.endswith(".json") else ""
        raise ValueError(f"{exc}{hint} (--cluster list shows them)") from None


def number_or_text(text: str) -> str | float:
    """``text`` as a number if it reads as one (a ratio, a margin), else as is (a codec name, a path)."""
    try:
        return float(text)
    except ValueError:
        return text

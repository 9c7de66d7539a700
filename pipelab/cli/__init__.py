"""The ``pipelab`` command line: one module per sub-command; this one only dispatches, so that
``pipelab --help`` imports nothing heavy (torch is imported inside a sub-command's ``main``)."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: sub-command -> (module whose ``main(argv)`` returns the exit code, help line)
COMMANDS: dict[str, tuple[str, str]] = {
    "profile": ("pipelab.cli.profile", "profile a model, or show a saved profile"),
    "plan": ("pipelab.cli.plan", "partition a profile for a cluster"),
    "simulate": ("pipelab.cli.simulate", "simulate a plan with a method"),
    "train": ("pipelab.cli.train", "run a job (job.json) on this machine or under torchrun"),
    "calibrate": ("pipelab.cli.calibrate", "measure this machine and write a calibrated cluster"),
    "reproduce": ("pipelab.cli.reproduce", "run the papers' reproductions (make reproduce)"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``pipelab`` script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help") or args[0] not in COMMANDS:
        p = argparse.ArgumentParser(prog="pipelab", description=(
            "Pipeline-parallel training lab: profile a model, plan its stages, simulate and train them. "
            "Your own model is package.module:function; run pipelab COMMAND --help for each."))
        sub = p.add_subparsers(dest="command", metavar="COMMAND")
        for name, (_, help_) in COMMANDS.items():
            sub.add_parser(name, help=help_, add_help=False)
        if args and args[0] not in ("-h", "--help"):
            from pipelab.cli._common import suggest

            p.error(f"unknown command {args[0]!r}{suggest(args[0], COMMANDS)} (the commands: "
                    f"{', '.join(COMMANDS)})")
        p.print_help()
        return 0 if args else 2
    module = importlib.import_module(COMMANDS[args[0]][0])
    return int(module.main(args[1:]))

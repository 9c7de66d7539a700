"""``pipelab reproduce``: run the papers' reproductions, which live in a checkout's ``reproductions/``."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

#: the checkout's root: the folder holding ``pipelab/`` and, in a clone, ``reproductions/``
ROOT = Path(__file__).resolve().parents[2]


def main(argv: Sequence[str]) -> int:
    """Run ``reproductions._common.driver.main`` from the checkout beside this package."""
    if not (ROOT / "reproductions" / "_common" / "driver.py").is_file():
        print(f"pipelab reproduce: no reproductions/ folder beside the package ({ROOT}); the reproductions "
              "ship with the repository, not the installed package: clone it and run `make reproduce` "
              "there", file=sys.stderr)
        return 2
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    driver = importlib.import_module("reproductions._common.driver")
    return int(driver.main(list(argv)))

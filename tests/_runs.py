"""The record of the session's one ``pipelab reproduce --only table1 --quick`` (made in conftest.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Table1QuickRun:
    """One ``pipelab reproduce --only table1 --quick`` (conftest's ``table1_quick_run``): its exit status,
    what it printed, ``git status --porcelain`` before and after (None: not a git checkout) and the run
    folders it made."""

    code: int
    printed: str
    status_before: str | None
    status_after: str | None
    new_folders: list[Path]

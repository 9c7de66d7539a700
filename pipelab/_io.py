"""Atomic file writes and JSON records with a schema version.

Every file pipelab writes goes through :func:`atomic_write_bytes` (a temporary file in the same folder,
fsynced, renamed over the target), so a crash never leaves a half-written file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temp file in the same folder, fsync, rename)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        # mkstemp creates 0600; give the file the mode an ordinary open() would (or keep the old one's)
        try:
            mode = os.stat(target).st_mode & 0o777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


def _umask() -> int:
    """The process umask, read without changing it where the OS allows (Linux), else set-and-restore."""
    with contextlib.suppress(OSError):
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    current = os.umask(0o022)
    os.umask(current)
    return current


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_record(path: str | os.PathLike[str], kind: str, schema: int, payload: dict[str, Any]) -> Path:
    """Save ``payload`` as JSON wrapped in ``{"pipelab": kind, "schema": schema, ...}``, atomically."""
    doc = {"pipelab": kind, "schema": schema, **payload}
    return atomic_write_text(path, json.dumps(doc, indent=1, sort_keys=False) + "\n")


def read_record(path: str | os.PathLike[str], kind: str, schema: int) -> dict[str, Any]:
    """Load a JSON record written by :func:`write_record`; ``ValueError`` for another kind or schema."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p} is not valid JSON ({exc}); it may be truncated or corrupt - "
                         f"re-create it (e.g. with `pipelab {kind} ...`)") from None
    if not isinstance(doc, dict) or doc.get("pipelab") != kind:
        found = doc.get("pipelab") if isinstance(doc, dict) else type(doc).__name__
        raise ValueError(f"{p} is not a pipelab {kind} file (found {found!r}); "
                         f"pass a file written by pipelab's {kind} .save()")
    if doc.get("schema") != schema:
        raise ValueError(f"{p} has {kind} schema version {doc.get('schema')!r}, this pipelab reads "
                         f"version {schema}; re-create the file with this version")
    return doc

"""Checkpoints on disk: one file per worker, sealed by a manifest written last.

``checkpoint_dir/step-00000010/`` holds ``rank-<r>.pt`` (torch.save of a dict, written atomically)
and ``manifest.json`` (step, plan fingerprint, method, run id, sha256 per file). Invariants: a
checkpoint exists once its manifest does, written by the run's one :class:`Sealer`; a killed run
leaves the previous one intact, and the next run removes the unsealed rest (:func:`clean`) under
the :class:`FolderLock`; :func:`load_worker` refuses another plan's or method's checkpoint and a
file that does not match its hash. Checkpoints are taken at drained points (docs/reliability.md).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from pipelab._io import atomic_write_bytes, read_record, write_record

SCHEMA_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d{8})$")


def plan_fingerprint(plan: Any) -> str:
    """A short hash of the plan's layout (layers per stage, replicas, ranks), predictions left out."""
    doc = {"num_layers": int(plan.num_layers), "profile": getattr(plan, "profile_fingerprint", ""),
           "stages": [[int(s.start), int(s.end), int(s.replicas), [int(r) for r in s.ranks]]
                      for s in plan.stages]}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def step_dir(checkpoint_dir: str | os.PathLike[str], step: int) -> Path:
    """The folder of the checkpoint taken after ``step`` optimizer steps."""
    if step < 0:
        raise ValueError(f"checkpoint step {step} must be >= 0")
    return Path(checkpoint_dir) / f"step-{int(step):08d}"


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the entries of folder ``path`` (a rename into it) durable (POSIX; a no-op elsewhere)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)


def write_worker(checkpoint_dir: str | os.PathLike[str], step: int, rank: int, state: dict[str, Any], *,
                 plan: Any, method: str, run_id: str = "") -> tuple[Path, str]:
    """Write worker ``rank``'s ``state`` for ``step`` atomically; returns the file's path and sha256."""
    buf = io.BytesIO()
    torch.save({"pipelab": "checkpoint-worker", "schema": SCHEMA_VERSION, "rank": int(rank),
                "step": int(step), "plan_fingerprint": plan_fingerprint(plan), "method": method,
                "run": run_id, "state": state}, buf)
    data = buf.getvalue()
    d = step_dir(checkpoint_dir, step)
    path = atomic_write_bytes(d / f"rank-{int(rank)}.pt", data)
    fsync_dir(d)
    fsync_dir(d.parent)
    return path, hashlib.sha256(data).hexdigest()


def save_worker(checkpoint_dir: str | os.PathLike[str], step: int, rank: int, state: dict[str, Any], *,
                plan: Any, method: str) -> Path:
    """Write worker ``rank``'s ``state`` for ``step`` atomically; returns the file's path."""
    return write_worker(checkpoint_dir, step, rank, state, plan=plan, method=method)[0]


def sha256_of(path: Path) -> str:
    """The sha256 of the file at ``path`` (hex)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def list_checkpoints(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints (with a readable manifest), oldest first."""
    root = Path(checkpoint_dir)
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.iterdir()):
        if _STEP_RE.match(p.name) and (p / "manifest.json").exists():
            try:
                read_record(p / "manifest.json", "checkpoint", SCHEMA_VERSION)
            except (ValueError, OSError):   # corrupt, or pruned by another worker meanwhile
                continue
            out.append(p)
    return out


def latest(checkpoint_dir: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint folder under ``checkpoint_dir``, or ``None``."""
    return next(reversed(list_checkpoints(checkpoint_dir)), None)


def resolve(path: str | os.PathLike[str]) -> Path:
    """A step folder from either a step folder or a checkpoint root (then its latest checkpoint)."""
    p = Path(path)
    if (p / "manifest.json").exists():
        return p
    last = latest(p)
    if last is None:
        raise FileNotFoundError(f"{p} holds no complete checkpoint (no step-*/manifest.json); pass a folder "
                                "written with checkpoint_every=..., checkpoint_dir=...")
    return last


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the checkpoint at ``path`` (a step folder or a checkpoint root)."""
    return read_record(resolve(path) / "manifest.json", "checkpoint", SCHEMA_VERSION)


def check_compatible(path: str | os.PathLike[str], *, plan: Any, method: str) -> dict[str, Any]:
    """Return the manifest if the checkpoint was written for ``plan`` and ``method``; else a clear error."""
    man = read_manifest(path)
    mine = [int(getattr(s, "tensor", 1)) for s in plan.stages]
    theirs = man.get("tensor", [1] * len(mine))
    if theirs != mine and len(theirs) == len(mine):
        raise ValueError(f"checkpoint {resolve(path)} holds shards of tensor degrees {theirs} (per stage) "
                         f"but this run's plan has degrees {mine}; a checkpoint's shards load only at the "
                         "degrees it was saved at (resharding is not supported): resume with the plan it was "
                         "written for")
    fp = plan_fingerprint(plan)
    if man["plan_fingerprint"] != fp:
        raise ValueError(f"checkpoint {resolve(path)} was written for another plan (config "
                         f"{man.get('plan_config')!r}, fingerprint {man['plan_fingerprint']}) than this "
                         f"run's (config {getattr(plan, 'config', '')!r}, fingerprint {fp}); resume with "
                         "the plan it was written for, or start without resume=")
    if man["method"] != method:
        raise ValueError(f"checkpoint {resolve(path)} was written by method {man['method']!r}, this run uses "
                         f"{method!r}; resume with method={man['method']!r}")
    return man


def load_worker(path: str | os.PathLike[str], rank: int, *, plan: Any, method: str) -> dict[str, Any]:
    """Worker ``rank``'s saved state from the checkpoint at ``path``, after the plan/method/hash checks."""
    man = check_compatible(path, plan=plan, method=method)
    d = resolve(path)
    name = f"rank-{int(rank)}.pt"
    if name not in man["files"]:
        raise ValueError(f"checkpoint {d} has no state for rank {rank} ({man['num_workers']} workers)")
    f = d / name
    if sha256_of(f) != man["files"][name]:
        raise ValueError(f"{f} does not match its manifest hash (modified or corrupt); use an older "
                         "checkpoint")
    doc = torch.load(f, map_location="cpu", weights_only=True)
    if man.get("run") and doc.get("run", man["run"]) != man["run"]:
        raise ValueError(f"{f} was written by run {doc.get('run')}, its manifest by run {man['run']} (two "
                         "runs wrote into one folder); use another checkpoint")
    if doc.get("rank") != rank or doc.get("step") != man["step"]:
        raise ValueError(f"{f} holds rank {doc.get('rank')} step {doc.get('step')}, expected rank {rank} "
                         f"step {man['step']}")
    return dict(doc["state"])


def global_weights(path: str | os.PathLike[str], *, plan: Any, method: str,
                   stage_ranks: Any) -> dict[int, dict[str, torch.Tensor]]:
    """Per stage, the weights all replicas saved at ``path`` (a HetPipe ``D = 0`` cut); they must agree."""
    out: dict[int, dict[str, torch.Tensor]] = {}
    for s, ranks in enumerate(stage_ranks):
        ref: dict[str, torch.Tensor] | None = None
        for r in ranks:
            st = load_worker(path, r, plan=plan, method=method)["stages"][s]["module"]
            if ref is None:
                ref = st
            elif set(st) != set(ref) or not all(torch.equal(st[k], ref[k]) for k in ref):
                raise ValueError(f"checkpoint {resolve(path)}: the replicas of stage {s} (workers "
                                 f"{list(ranks)}) saved different weights, so it is not a synchronized cut "
                                 "of the parameter server")
        assert ref is not None
        out[s] = ref
    return out


class Sealer:
    """A run's one manifest writer: seals a step once every rank reported ``(step, rank, sha256)``."""

    def __init__(self, checkpoint_dir: str | os.PathLike[str], *, plan: Any, method: str,
                 num_workers: int | None = None, run_id: str = "", extra: dict[str, Any] | None = None,
                 keep: int | None = 2) -> None:
        self.root, self.plan, self.method = Path(checkpoint_dir), plan, method
        self.n = int(num_workers if num_workers is not None else plan.num_workers)
        self.run_id, self.extra, self.keep = run_id, dict(extra or {}), keep
        self.pending: dict[int, dict[int, str]] = {}
        self.sealed: list[int] = []

    def report(self, step: int, rank: int, sha256: str) -> None:
        """Record rank ``rank``'s file of ``step``; seal the step once every rank's is in."""
        got = self.pending.setdefault(int(step), {})
        got[int(rank)] = sha256
        if len(got) < self.n:
            return
        del self.pending[int(step)]
        self.seal(step, got)
        self.sealed.append(int(step))

    def seal(self, step: int, hashes: dict[int, str] | None = None) -> Path:
        """Write ``step``'s manifest (``hashes``: rank -> sha256, else read); prune to ``keep`` newest;
        ``FileNotFoundError`` names the ranks whose file is missing."""
        d = step_dir(self.root, step)
        missing = [r for r in range(self.n) if not (d / f"rank-{r}.pt").exists()]
        if missing:
            raise FileNotFoundError(f"checkpoint {d} lacks the files of ranks {missing}; every worker must "
                                    "call save_worker before the manifest is written")
        hashes = hashes or {}
        files = {f"rank-{r}.pt": hashes.get(r) or sha256_of(d / f"rank-{r}.pt") for r in range(self.n)}
        path = write_record(d / "manifest.json", "checkpoint", SCHEMA_VERSION,
                            {"step": int(step), "plan_fingerprint": plan_fingerprint(self.plan),
                             "method": self.method, "num_workers": self.n,
                             "plan_config": getattr(self.plan, "config", ""), "files": files,
                             "run": self.run_id, "extra": self.extra,
                             "tensor": [int(getattr(s, "tensor", 1)) for s in self.plan.stages]})
        fsync_dir(d)
        if self.keep is not None and self.keep > 0:
            for old in list_checkpoints(self.root)[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        return path


class CheckpointBusy(OSError):
    """Another live process holds the checkpoint folder (``checkpoint_dir in use by pid N``)."""


class FolderLock:
    """An exclusive ``flock`` on a checkpoint folder for a run's life (dropped when the holder dies)."""

    NAME = ".lock"

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.root / self.NAME, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            import fcntl
        except ImportError:     # not POSIX: no lock
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = os.pread(self._fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(self._fd)
            self._fd = None
            raise CheckpointBusy(f"checkpoint_dir in use by pid {pid}: {self.root} is locked by another run "
                                 "(a second writer or resumer would mix two runs' files); wait for it to "
                                 "end, stop it, or use another folder") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def clean(checkpoint_dir: str | os.PathLike[str]) -> list[Path]:
    """Remove step folders without a manifest and temp files (hold the :class:`FolderLock`); return them."""
    root = Path(checkpoint_dir)
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for p in sorted(root.iterdir()):
        if p.is_dir() and _STEP_RE.match(p.name):
            if not (p / "manifest.json").exists():
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
                continue
            for tmp in p.glob(".*.tmp"):
                tmp.unlink(missing_ok=True)
                removed.append(tmp)
    if removed:
        fsync_dir(root)
    return removed


def verify(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of step folder ``path``; raises ``ValueError`` naming a missing or changed file."""
    d = Path(path)
    man = read_record(d / "manifest.json", "checkpoint", SCHEMA_VERSION)
    for name, sha in man["files"].items():
        f = d / name
        if not f.is_file():
            raise ValueError(f"{f} is missing (the manifest lists it); the checkpoint is damaged")
        if sha256_of(f) != sha:
            raise ValueError(f"{f} does not match its manifest hash (modified or corrupt)")
    return man


def choose_resume(path: str | os.PathLike[str], *, fallback: bool = True) -> Path:
    """The verified step folder to resume from (``fallback``: skip a damaged newest one, warning)."""
    p = Path(path)
    if (p / "manifest.json").exists():
        verify(p)
        return p
    cps = list_checkpoints(p) or [resolve(p)]    # resolve raises: no complete checkpoint there
    for i, d in enumerate(reversed(cps)):
        try:
            verify(d)
            return d
        except ValueError as exc:
            if not fallback or i == len(cps) - 1:
                extra = "" if fallback else "; resume_fallback=True resumes from the previous sealed one"
                raise ValueError(f"cannot resume from {d}: {exc}{extra}") from None
            warnings.warn(f"checkpoint {d} is damaged ({exc}); resuming from the previous sealed checkpoint, "
                          f"{cps[-2 - i]}", RuntimeWarning, stacklevel=2)
    raise AssertionError("unreachable")

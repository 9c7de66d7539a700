"""Importable data, optimizers, oracles and process probes for the fault tests (workers import it)."""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import test_runtime_helpers as H
import torch

NAN_STEP = 3     # inf_data's minibatch with an infinite input


def inf_data() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """mlp_data, with an infinite input in minibatch NAN_STEP (its loss and gradients are NaN)."""
    for k, (x, y) in enumerate(H.mlp_data()):
        if k == NAN_STEP:
            x = x.clone()
            x[0, 0] = float("inf")
        yield x, y


huge_lr = functools.partial(torch.optim.SGD, lr=1e6)


def reference_skipping(steps: int, skip: Iterable[int], opt_fn: Any = H.sgd) -> dict[str, torch.Tensor]:
    """The oracle of on_nonfinite='skip': plain training of the MLP on inf_data, the updates of
    ``skip`` dropped (gradients cleared, no optimizer step)."""
    torch.manual_seed(0)
    model = H.mlp()
    opt = opt_fn(model.parameters())
    it = iter(inf_data())
    skip = set(skip)
    for k in range(steps):
        x, y = next(it)
        opt.zero_grad()
        H.loss_fn(model(x), y).backward()
        if k not in skip:
            opt.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def wait_gone(pids: Iterable[int], within_s: float) -> tuple[float, list[int]]:
    """Seconds until none of ``pids`` is alive (polled), and those still alive after ``within_s``."""
    t0 = time.perf_counter()
    pids = list(pids)
    while time.perf_counter() - t0 < within_s:
        if not any(alive(p) for p in pids):
            return time.perf_counter() - t0, []
        time.sleep(0.02)
    return time.perf_counter() - t0, [p for p in pids if alive(p)]


def kill_all(pids: Iterable[int]) -> None:
    """SIGKILL what is left (a failing test must not leave processes behind)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def listening(pids: Iterable[int]) -> list[tuple[str, int]]:
    """The TCP addresses processes ``pids`` listen on, as ``(address, port)`` (Linux /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    out = []
    for name in ("tcp", "tcp6"):
        path = Path(f"/proc/net/{name}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:     # 0A: LISTEN
                continue
            hexaddr, hexport = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if name == "tcp":
                addr = ".".join(str(b) for b in raw[::-1])
            else:
                words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]
                addr = bytes(b for w in words for b in w).hex()
                addr = {"0" * 32: "::", "0" * 31 + "1": "::1"}.get(addr, addr)
            out.append((addr, int(hexport, 16)))
    return out


def stuck_mid_message(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A loss that, in a worker process, leaves its pipe in the middle of a 1 MiB message and hangs."""
    import gc
    import struct
    import warnings

    from pipelab.runtime.process import PipeSink

    with warnings.catch_warnings():    # isinstance on every object touches deprecated torch aliases
        warnings.simplefilter("ignore")
        sink = next((o for o in gc.get_objects() if isinstance(o, PipeSink)), None)
    if sink is None:          # the parent's checks in prepare: no worker pipe here
        return H.loss_fn(out, y)
    sink.conn._send(struct.pack("!i", 1 << 20) + b"the first bytes of a large message")
    time.sleep(600)
    return H.loss_fn(out, y)

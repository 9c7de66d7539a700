"""What ties a job's workers to their launcher, and keeps its rendezvous closed.

Invariants: a worker never outlives its launcher (:func:`watch_launcher` ends it with ``os._exit``
when the launcher's end of its pipe closes, or under torchrun when its OS parent changes); a
single-host rendezvous listens on ``127.0.0.1`` on a socket the launcher bound itself, so no other
run takes the port in between, and gloo uses the loopback interface.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import sys
import threading
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any

#: what a worker that died before a word most likely means when its launcher is a script
MAIN_GUARD_HINT = ('Run from a script? Worker processes re-import it, so put the call under '
                   '`if __name__ == "__main__":`')
#: the launcher died: a worker's exit code when its lifeline closes (128 + SIGHUP, as a shell reports it)
ORPHANED_EXIT = 129


def watch_launcher(poll_s: float = 0.5) -> threading.Thread:
    """End this process (``os._exit``) as soon as the process that launched it is gone."""
    parent = multiprocessing.parent_process()
    sentinel = getattr(parent, "sentinel", None)
    if sentinel is not None:
        def watch() -> None:
            wait([sentinel])
            os._exit(ORPHANED_EXIT)
    else:      # started by subprocess (torchrun's agent): watch the OS parent
        ppid = os.getppid()

        def watch() -> None:
            stop = threading.Event()
            while os.getppid() == ppid:
                stop.wait(poll_s)
            os._exit(ORPHANED_EXIT)
    t = threading.Thread(target=watch, daemon=True, name="pipelab-lifeline")
    t.start()
    return t


def check_port(port: Any) -> int:
    """``port`` as an int in 1..65535, else a ``ValueError`` saying what to pass."""
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError(f"port={port!r} is not a TCP port (1..65535); pass a free port, or leave port=None "
                         "to let the kernel pick one")
    return port


class Rendezvous:
    """A single-host job's rendezvous store on loopback (``port=None``: the kernel picks one)."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None, timeout_s: float = 300.0) -> None:
        import torch.distributed as dist

        want = 0 if port is None else check_port(port)
        sk = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sk.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # a port in TIME_WAIT, never one in use
        try:
            sk.bind((host, want))
            sk.listen(1024)
        except OSError as exc:
            sk.close()
            raise ValueError(f"port {want} on {host} is in use or not available ({exc.strerror}); pass a "
                             "free port, or leave port=None to let pipelab pick one") from None
        self.host, self.port = host, int(sk.getsockname()[1])
        try:   # the store owns (and closes) a duplicate of the listening socket
            self.store: Any = dist.TCPStore(host, self.port, is_master=True, wait_for_workers=False,
                                            timeout=timedelta(seconds=timeout_s),
                                            master_listen_fd=os.dup(sk.fileno()))
        finally:
            sk.close()

    def close(self) -> None:
        """Stop listening (idempotent)."""
        self.store = None


def loopback_interface() -> str | None:
    """The name of this host's loopback network interface (``lo`` on Linux), or ``None``."""
    try:
        names = [n for _, n in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    return next((n for n in names if n == "lo" or n.startswith("lo") and sys.platform == "darwin"), None)


def use_loopback() -> None:
    """Make gloo (created after this call, in this process) listen on the loopback interface only."""
    lo = loopback_interface()
    if lo is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = lo


def signal_name(code: int) -> str:
    """`` (SIGKILL)`` for a process ended by a signal (a negative exit code), else ``""``."""
    try:
        return f" ({signal.Signals(-code).name})" if code < 0 else ""
    except ValueError:
        return ""

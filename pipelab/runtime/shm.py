"""Point-to-point messages through shared memory, for workers on one host (gloo backend).

Each ordered pair gets a *ring* of ``K`` slots in a shared-memory file: the sender copies message
``k`` into slot ``k % K`` and stamps it ``k + 1``; the receiver sleeps on the ring's futex *bell*
until the stamp shows, copies the message out and counts it consumed, freeing the slot. Invariants:
matching is by order per pair, each slot's tag checked; the files are unlinked once mapped; stamps
follow the payload, safe under x86-64's store order (:func:`available`).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import shutil
import socket
import struct
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from pipelab.runtime.comm import DistComm, OrderError, Recv, Send, TensorSpec, empty_for, pack, unpack

HEADER = 64            # bytes before the first slot: consumed count, K, slot size, bell
_SYS_FUTEX, _FUTEX_WAIT, _FUTEX_WAKE = 202, 0, 1     # x86-64 Linux; shared (not private) futexes
_libc = ctypes.CDLL(None, use_errno=True) if platform.system() == "Linux" else None


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]
SLOT_HEADER = 64       # per slot: stamp (k + 1), tag, payload bytes
MAX_RING_BYTES = 64 << 20   # K shrinks so one ring stays under this (a full ring queues at the sender)
MAX_SLOTS = 64
_WORD, _PAIR = struct.Struct("<q"), struct.Struct("<qq")   # header words, native x86-64 order


def available(backend: str) -> bool:
    """Whether this machine can use shared-memory messages (gloo on x86-64 Linux)."""
    return (backend == "gloo" and _libc is not None
            and platform.machine().lower() in ("x86_64", "amd64"))


def folder_base() -> str | None:
    """Where the rings' files go: ``/dev/shm`` where it exists, else the temporary folder."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


def ring_shape(msgs: Sequence[Sequence[TensorSpec]]) -> tuple[int, int]:
    """``(K, slot bytes)`` of the ring carrying ``msgs`` (one pair's messages, in order)."""
    slot = max(8, (max(message_nbytes(m) for m in msgs) + 63) // 64 * 64)
    return max(1, min(len(msgs), MAX_SLOTS, MAX_RING_BYTES // (SLOT_HEADER + slot))), slot


def ring_bytes(incoming: dict[int, list[list[TensorSpec]]]) -> int:
    """Bytes of the rings a worker receiving ``incoming`` creates."""
    shapes = [ring_shape(msgs) for msgs in incoming.values()]
    return sum(HEADER + k * (SLOT_HEADER + slot) for k, slot in shapes)


def unusable(world: int, need: int, backend: str = "gloo") -> str | None:
    """Why these workers can't message through shared memory (``None``: they can); a collective where
    ``backend`` can (:func:`available`). ``need``: this worker's :func:`ring_bytes`; every rank agrees."""
    if not available(backend):
        return f"it needs the gloo backend on x86-64 Linux (backend {backend!r} here)"
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            me = socket.gethostname() + "/" + f.read().strip()
    except OSError:
        me = socket.gethostname()
    folder = folder_base() or tempfile.gettempdir()
    st = os.statvfs(folder)
    seen: list[Any] = [None] * world
    dist.all_gather_object(seen, (me, need, st.f_bavail * st.f_frsize))
    if len({host for host, _, _ in seen}) > 1:
        return "the workers run on several hosts"
    total, free = sum(n for _, n, _ in seen), seen[0][2]
    if 2 * total > free:   # half the room at most: the rest of the host uses it too
        return (f"its rings need {total / 2**20:.1f} MiB and {folder} has {free / 2**20:.1f} MiB free "
                "(give it at least twice that, e.g. docker's --shm-size)")
    return None


def message_nbytes(specs: Sequence[TensorSpec]) -> int:
    """Bytes of the packed message of ``specs`` (as :func:`pipelab.runtime.comm.pack` lays it out)."""
    if len(specs) == 1:
        return specs[0].nbytes
    return sum((s.nbytes + 7) // 8 * 8 for s in specs)


class _Ring:
    """One direction of one pair: ``K`` slots of ``slot`` bytes in a mapped file."""

    def __init__(self, path: str, create: tuple[int, int] | None = None) -> None:
        if create is not None:
            k, slot = create
            size = HEADER + k * (SLOT_HEADER + slot)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            os.ftruncate(fd, size)
        else:
            fd = os.open(path, os.O_RDWR)
            size = os.fstat(fd).st_size
        # every page mapped now (a fresh page's first touch costs a fault in the middle of a run)
        self.map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        os.close(fd)
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8)
        if create is not None:
            _WORD.pack_into(self.map, 8, create[0])
            _WORD.pack_into(self.map, 16, create[1])
        self.k, self.slot = self._get(8), self._get(16)
        self.bell_addr = ctypes.c_void_p(self.bytes.data_ptr() + 24)

    def _get(self, offset: int) -> int:
        return int(_WORD.unpack_from(self.map, offset)[0])

    def _at(self, k: int) -> int:
        """Byte offset of message ``k``'s slot header."""
        return HEADER + (k % self.k) * (SLOT_HEADER + self.slot)

    def consumed(self) -> int:
        return self._get(0)

    def stamp(self, k: int) -> int:
        return self._get(self._at(k))

    def bell(self) -> int:
        """The bell's count (low 32 bits: the futex word)."""
        return self._get(24) & 0xFFFFFFFF

    def ring(self) -> None:
        """Raise the bell and wake a receiver sleeping on it."""
        _WORD.pack_into(self.map, 24, (self._get(24) + 1) & 0xFFFFFFFF)
        assert _libc is not None
        _libc.syscall(_SYS_FUTEX, self.bell_addr, _FUTEX_WAKE, 1, None, None, 0)

    def sleep(self, seen: int, seconds: float) -> None:
        """Sleep while the bell still reads ``seen`` (at most ``seconds``)."""
        ts = _Timespec(int(seconds), int((seconds % 1) * 1e9))
        assert _libc is not None
        _libc.syscall(_SYS_FUTEX, self.bell_addr, _FUTEX_WAIT, ctypes.c_uint32(seen), ctypes.byref(ts),
                      None, 0)

    def write(self, k: int, tag: int, buf: torch.Tensor) -> None:
        """Copy message ``k`` into its slot, then stamp it (the stamp last)."""
        at = self._at(k)
        n = buf.numel() * buf.element_size()
        if n:
            start = at + SLOT_HEADER
            self.bytes[start:start + n].copy_(buf.reshape(-1).view(torch.uint8))
        _PAIR.pack_into(self.map, at + 8, tag, n)
        _WORD.pack_into(self.map, at, k + 1)

    def read(self, k: int, out: torch.Tensor) -> tuple[int, int]:
        """Copy message ``k`` (stamped) into ``out``; count it consumed; return its (tag, bytes)."""
        at = self._at(k)
        t, n = _PAIR.unpack_from(self.map, at + 8)
        want = out.numel() * out.element_size()
        if n == want and n:
            start = at + SLOT_HEADER
            out.reshape(-1).view(torch.uint8).copy_(self.bytes[start:start + n])
        if n == want:
            _WORD.pack_into(self.map, 0, k + 1)
        return int(t), int(n)

    def close(self) -> None:
        del self.bytes
        self.map.close()


class ShmComm(DistComm):
    """:class:`~pipelab.runtime.comm.DistComm` with point-to-point messages through shared memory.

    All-reduces, local hand-offs, order checks and host staging are :class:`DistComm`'s. Build it with
    :meth:`open` (a collective): ``incoming`` per source worker the specs of its messages here, in
    order; ``outgoing`` the workers this one sends to.
    """

    def __init__(self, rank: int, device: torch.device, groups: dict[int, Any], *, timeout: float,
                 **kwargs: Any) -> None:
        super().__init__(rank, device, groups, **kwargs)
        self.timeout = timeout
        self._in: dict[int, _Ring] = {}
        self._out: dict[int, _Ring] = {}
        self._recv_k: dict[int, int] = {}
        self._send_k: dict[int, int] = {}
        self._queued: dict[int, deque[tuple[int, int, torch.Tensor]]] = {}
        self._want: dict[tuple[int, int], tuple[int, list[TensorSpec]]] = {}

    @classmethod
    def open(cls, rank: int, world: int, device: torch.device, groups: dict[int, Any],
             incoming: dict[int, list[list[TensorSpec]]], outgoing: Sequence[int], *, timeout: float,
             **kwargs: Any) -> ShmComm:
        """Create this worker's incoming rings, map its outgoing ones (every rank calls it at once)."""
        comm = cls(rank, device, groups, timeout=timeout, **kwargs)
        where = [tempfile.mkdtemp(prefix="pipelab-p2p-", dir=folder_base()) if rank == 0 else None]
        dist.broadcast_object_list(where, src=0)
        folder = str(where[0])
        try:
            for src, msgs in incoming.items():
                comm._in[src] = _Ring(os.path.join(folder, f"ring{src}-{rank}"), create=ring_shape(msgs))
            dist.barrier()
            for dst in outgoing:
                comm._out[dst] = _Ring(os.path.join(folder, f"ring{rank}-{dst}"))
            dist.barrier()
        finally:
            if rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
        return comm

    # ------------------------------------------------------------------ receive
    def post(self, r: Recv) -> None:
        """Assign ``r`` its place in the pair's sequence (no I/O: the message lands in the ring)."""
        key = (r.src, r.tag)
        if r.src == self.rank or key in self._want:
            return
        self._in_order(1, r.src, r.tag)
        k = self._recv_k.get(r.src, 0)
        self._recv_k[r.src] = k + 1
        self._want[key] = (k, r.specs)

    def wait(self, r: Recv) -> list[torch.Tensor]:
        """Block until ``r``'s message is in its slot; return a copy of its tensors."""
        key = (r.src, r.tag)
        if r.src == self.rank:
            return super().wait(r)
        if key not in self._want:
            self.post(r)
        k, specs = self._want.pop(key)
        ring = self._in[r.src]
        deadline = None
        while True:
            seen = ring.bell()
            if ring.stamp(k) == k + 1:
                break
            self._pump()
            if deadline is None:
                deadline = time.monotonic() + self.timeout
            elif time.monotonic() > deadline:
                raise TimeoutError(f"worker {self.rank}: message #{k} from worker {r.src} (tag {r.tag}) did "
                                   f"not arrive within {self.timeout:.0f} s")
            ring.sleep(seen, 0.05 if self._queued_any() else 1.0)
        buf = empty_for(specs, self.wire)
        got, n = ring.read(k, buf)
        if got != r.tag or n != buf.numel() * buf.element_size():
            raise OrderError(f"worker {self.rank}: message #{k} from worker {r.src} has tag {got} ({n} B) "
                             f"but this receive expects tag {r.tag} ({buf.numel() * buf.element_size()} "
                             "bytes); the two workers disagree on their pair's message sequence")
        if buf.device != self.device:
            buf = buf.to(self.device)
        return unpack(buf, specs)

    # ------------------------------------------------------------------ send
    def send(self, s: Send) -> int:
        """Copy ``s`` into its slot (or queue it while the slot is taken); returns its payload bytes."""
        if s.dst == self.rank:
            return super().send(s)
        nbytes = sum(t.numel() * t.element_size() for t in s.tensors)
        self._in_order(0, s.dst, s.tag)
        ring = self._out.get(s.dst)
        if ring is None:
            raise OrderError(f"worker {self.rank} sends to worker {s.dst}, which the schedule gives no "
                             "message from it")
        buf = pack(s.tensors).cpu()
        n = buf.numel() * buf.element_size()
        if n > ring.slot:
            raise ValueError(f"worker {self.rank}: a {n}-byte message to worker {s.dst} is larger than the "
                             f"{ring.slot} bytes its layout allows")
        k = self._send_k.get(s.dst, 0)
        self._send_k[s.dst] = k + 1
        q = self._queued.setdefault(s.dst, deque())
        q.append((k, s.tag, buf))     # held as gloo holds a send's buffer: nothing writes to it again
        self._pump(s.dst)
        return nbytes

    def _pump(self, only: int | None = None) -> None:
        """Write the queued messages whose slots are free, ringing the receivers' bells."""
        for dst in ([only] if only is not None else list(self._queued)):
            q = self._queued.get(dst)
            if not q:
                continue
            ring, wrote = self._out[dst], False
            while q and ring.consumed() > q[0][0] - ring.k:
                k, t, buf = q.popleft()
                ring.write(k, t, buf)
                wrote = True
            if wrote:
                ring.ring()

    def _queued_any(self) -> bool:
        return any(self._queued.values())

    def retire(self, keys: Sequence[tuple[int, int]]) -> None:
        """Nothing waits on a written message; write what is queued."""
        self._pump()

    def held(self) -> list[torch.Tensor]:
        """The message buffers this worker holds: queued sends and local hand-offs."""
        out = [buf for q in self._queued.values() for _, _, buf in q]
        return out + [t for ts in self._local.values() for t in ts]

    def flush(self) -> None:
        """Write every queued message (waiting for the receivers to free their slots)."""
        deadline = time.monotonic() + self.timeout
        while self._queued_any():
            self._pump()
            if not self._queued_any():
                break
            if time.monotonic() > deadline:
                late = sorted(d for d, q in self._queued.items() if q)
                raise TimeoutError(f"worker {self.rank}: messages to workers {late} were not taken within "
                                   f"{self.timeout:.0f} s")
            time.sleep(0.0005)

    def close(self) -> None:
        """Unmap the rings."""
        for ring in list(self._in.values()) + list(self._out.values()):
            try:
                ring.close()
            except BufferError:     # a tensor still views the map: it goes when the process does
                pass
        self._in.clear()
        self._out.clear()

"""Messages between stages: what crosses each cut, how it is packed, tagged and moved.

A *message* is the tensors one stage hands its neighbour for one microbatch. Each cut's layout is
known before the run (:func:`boundary_specs`), so receives are posted early without a header;
several tensors travel packed in one byte buffer (members padded to 8 bytes).

Matching. Correctness rests on order, not tags: the validator proves each ordered pair of workers
sends and receives in one sequence, and receives are posted in action order. ``match="order"``
(NCCL; gloo with ``PIPELAB_P2P_MATCH=order``) sends tag 0 and checks each message against it.

Lanes. gloo sends on two process groups, one per direction, so messages crossing between a pair
don't contend for one connection's lock; a pair's messages share a lane, keeping their order.

Transports: :class:`DistComm` (gloo, via host memory for CUDA stages, or NCCL) and :class:`Mailbox`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.fx as fx
from torch.fx.passes.shape_prop import ShapeProp

from pipelab.graph import layer_members, live_across_cuts
from pipelab.schedules.actions import Schedule
from pipelab.schedules.messages import Message, pair_sequences

ACT, GRAD = 0, 1   # message directions
MATCH_MODES = ("tag", "order")


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one tensor in a message (dtype as its name, e.g. ``"float32"``)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def torch_dtype(self) -> torch.dtype:
        """The ``torch.dtype``."""
        return getattr(torch, self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor."""
        return math.prod(self.shape) * self.torch_dtype.itemsize

    @property
    def is_float(self) -> bool:
        """Whether gradients flow through this value."""
        return self.torch_dtype.is_floating_point or self.torch_dtype.is_complex

    @classmethod
    def of(cls, shape: Sequence[int], dtype: torch.dtype) -> TensorSpec:
        """The spec of a ``shape``/``dtype`` tensor."""
        return cls(tuple(int(d) for d in shape), str(dtype).removeprefix("torch."))


VERSION_SPEC = TensorSpec((1,), "int64")   # weight version riding with activations (vertical sync)


def tag(direction: int, boundary: int, microbatch: int, num_boundaries: int) -> int:
    """The p2p tag of the message crossing cut ``boundary`` for ``microbatch`` in ``direction``."""
    return (microbatch * max(num_boundaries, 1) + boundary) * 2 + direction


def message_tag(msg: Message, num_boundaries: int) -> int:
    """The tag of a schedule message (:class:`pipelab.schedules.messages.Message`)."""
    if msg.kind == "act":
        return tag(ACT, msg.stage, msg.microbatch, num_boundaries)
    return tag(GRAD, msg.stage - 1, msg.microbatch, num_boundaries)


def peer_orders(schedule: Schedule, rank: int, carried: Callable[[Message], bool] | None = None
                ) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """``(sends, receives)`` of worker ``rank``: per peer, its messages' tags in pair-sequence order
    (only those ``carried(msg)`` says travel; default: all)."""
    nb = max(schedule.num_stages - 1, 1)
    sends: dict[int, list[int]] = {}
    recvs: dict[int, list[int]] = {}
    for (src, dst), seq in pair_sequences(schedule).items():
        if src == rank:
            sends[dst] = [message_tag(m, nb) for m in seq.sent if carried is None or carried(m)]
        if dst == rank:
            recvs[src] = [message_tag(m, nb) for m in seq.received if carried is None or carried(m)]
    return sends, recvs


def boundary_specs(gm: fx.GraphModule, inputs: Sequence[torch.Tensor],
                   ranges: Sequence[tuple[int, int]]) -> list[list[TensorSpec]]:
    """Specs of the live values across each cut, from one shape-propagating run on ``inputs``; a
    ``TypeError`` names the producing and using layers of a crossing value that is not a tensor."""
    ShapeProp(gm).propagate(*inputs)
    nodes = {n.name: n for n in gm.graph.nodes}
    cuts = live_across_cuts(gm)
    members = layer_members(gm)
    n_layers = len(members)
    out: list[list[TensorSpec]] = []
    for _, end in ranges[:-1]:
        if not 0 < end < n_layers:
            raise ValueError(f"stage boundary {end} is outside 1..{n_layers - 1}")
        specs = []
        for name in cuts[end - 1]:
            meta = nodes[name].meta.get("tensor_meta")
            if meta is None or not hasattr(meta, "shape"):
                raise TypeError(_not_a_tensor(name, end, meta, members))
            specs.append(TensorSpec.of(meta.shape, meta.dtype))
        out.append(specs)
    return out


def _describe_layer(members: Sequence[Sequence[fx.Node]], i: int) -> str:
    head = members[i][0]
    what = f"module {head.target!r}" if head.op == "call_module" else f"{head.op} {head.name!r}"
    return f"layer {i} ({what})"


def _not_a_tensor(name: str, end: int, meta: Any, members: Sequence[Sequence[fx.Node]]) -> str:
    """Why value ``name`` cannot cross the cut before layer ``end``, and which layers to change."""
    layer_of = {n.name: i for i, group in enumerate(members) for n in group}
    node = next((n for group in members for n in group if n.name == name), None)
    kind = ("a tuple" if isinstance(meta, (tuple, list)) else
            "not a tensor" if meta is None else type(meta).__name__)
    if node is None:  # a model input that is not a tensor
        return (f"model input {name!r} crosses the cut after layer {end - 1} but is not a tensor; "
                "pass the model tensors only, or move the cut")
    producer = layer_of[name]
    users = sorted({layer_of[u.name] for u in node.users if u.name in layer_of and layer_of[u.name] >= end})
    used_by = ", ".join(_describe_layer(members, j) for j in users) or "the model's output"
    return (
        f"value {name!r} ({kind}) crosses the cut after layer {end - 1} but is not a tensor: it is produced "
        f"by {_describe_layer(members, producer)} and used whole by {used_by}. Move the cut outside layers "
        f"{producer}..{users[-1] if users else len(members) - 1}, or make the module that produces and the "
        "one that uses it a single leaf (trace(..., leaf_modules=[TheirParentClass]) or a smaller depth=N), "
        "or change the model to pass tensors between layers (index the tuple where it is produced)"
    )


def grad_specs(specs: Sequence[TensorSpec]) -> list[TensorSpec]:
    """The members of an activation message that carry gradients back (floating point)."""
    return [s for s in specs if s.is_float]


def _padded(n: int) -> int:
    return (n + 7) // 8 * 8


def pack(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One tensor standing for the message: the tensor itself, or a padded byte buffer."""
    if len(tensors) == 1:
        return tensors[0].detach().contiguous()
    sizes = [t.numel() * t.element_size() for t in tensors]
    buf = torch.zeros(sum(_padded(n) for n in sizes), dtype=torch.uint8, device=tensors[0].device)
    off = 0
    for t, n in zip(tensors, sizes):
        if n:
            buf[off:off + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
        off += _padded(n)
    return buf


def empty_for(specs: Sequence[TensorSpec], device: torch.device) -> torch.Tensor:
    """A receive buffer for a message of ``specs``."""
    if len(specs) == 1:
        return torch.empty(specs[0].shape, dtype=specs[0].torch_dtype, device=device)
    return torch.empty(sum(_padded(s.nbytes) for s in specs), dtype=torch.uint8, device=device)


def unpack(buf: torch.Tensor, specs: Sequence[TensorSpec]) -> list[torch.Tensor]:
    """Inverse of :func:`pack`: views into ``buf`` with the specs' shapes and dtypes."""
    if len(specs) == 1:
        return [buf]
    out, off = [], 0
    for s in specs:
        n = s.nbytes
        out.append(buf[off:off + n].view(s.torch_dtype).view(s.shape))
        off += _padded(n)
    return out


@dataclass
class Recv:
    """A receive a worker's next action needs: from ``src`` with ``tag``, laid out as ``specs``."""

    src: int
    tag: int
    specs: list[TensorSpec]
    members: list[TensorSpec] | None = None   # the message's tensors when it travels compressed


@dataclass
class Send:
    """A message an action produced: ``tensors`` to worker ``dst`` with ``tag``."""

    dst: int
    tag: int
    tensors: list[torch.Tensor]


class OrderError(RuntimeError):
    """A send or receive out of the schedule's per-pair sequence (``match="order"``)."""


class DistComm:
    """Point-to-point messages and group all-reduces over ``torch.distributed`` (gloo or NCCL).

    Receives are posted (:meth:`post`, idempotent) and completed (:meth:`wait`); sends are asynchronous
    and their buffers kept until :meth:`retire` or :meth:`flush`. ``match="order"`` needs ``orders``
    from :func:`peer_orders`; ``through_host`` stages CUDA tensors through host memory; ``lanes`` are
    the two directions' process groups (``None``: the default group).
    """

    def __init__(self, rank: int, device: torch.device, groups: dict[int, Any], *, match: str = "tag",
                 orders: tuple[dict[int, list[int]], dict[int, list[int]]] | None = None,
                 through_host: bool = False, lanes: tuple[Any, Any] | None = None) -> None:
        if match not in MATCH_MODES:
            raise ValueError(f"match={match!r}; use one of {MATCH_MODES}")
        if match == "order" and orders is None:
            raise ValueError("match='order' needs orders=peer_orders(schedule, rank)")
        self.rank = rank
        self.device = device
        self.groups = groups
        self.match = match
        self.wire = torch.device("cpu") if through_host else device
        self._orders = orders
        self._next_send: dict[int, int] = {}
        self._next_post: dict[int, int] = {}
        self._posted: dict[tuple[int, int], tuple[Any, torch.Tensor, list[TensorSpec]]] = {}
        self._sends: dict[tuple[int, int], tuple[Any, torch.Tensor]] = {}   # (dst, tag) -> (work, buffer)
        self._local: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.lanes = lanes

    def _lane(self, src: int, dst: int) -> Any:
        """The process group a message from ``src`` to ``dst`` travels on."""
        return None if self.lanes is None else self.lanes[0 if src < dst else 1]

    def _in_order(self, side: int, peer: int, t: int) -> int:
        """The wire tag of message ``t`` to/from ``peer`` (``side`` 0: send, 1: receive); in order mode,
        check it is the next one of the schedule's sequence for that peer."""
        if self.match == "tag":
            return t
        assert self._orders is not None
        seq = self._orders[side].get(peer, [])
        counter = self._next_send if side == 0 else self._next_post
        k = counter.get(peer, 0)
        if k >= len(seq) or seq[k] != t:
            what = "send to" if side == 0 else "receive from"
            want = f"tag {seq[k]}" if k < len(seq) else "no more messages"
            raise OrderError(f"worker {self.rank}: message #{k} of its {what} worker {peer} has tag {t} "
                             f"but the schedule's per-pair sequence says {want}; in-order matching would "
                             "deliver the wrong tensor (check the schedule with pipelab.schedules.validate)")
        counter[peer] = k + 1
        return 0

    def post(self, r: Recv) -> None:
        """Post the receive for ``r`` now, unless already posted (or local)."""
        key = (r.src, r.tag)
        if r.src == self.rank or key in self._posted:
            return
        wire_tag = self._in_order(1, r.src, r.tag)
        buf = empty_for(r.specs, self.wire)
        work = dist.irecv(buf, src=r.src, tag=wire_tag, group=self._lane(r.src, self.rank))
        self._posted[key] = (work, buf, r.specs)

    def wait(self, r: Recv) -> list[torch.Tensor]:
        """Block until ``r``'s message arrived; return its tensors."""
        key = (r.src, r.tag)
        if r.src == self.rank:
            return self._local.pop(key)
        if key not in self._posted:
            self.post(r)
        work, buf, specs = self._posted.pop(key)
        work.wait()
        if buf.device != self.device:    # staged through host memory: back onto the stage's device
            buf = buf.to(self.device)
        return unpack(buf, specs)

    def send(self, s: Send) -> int:
        """Start sending ``s``; returns its payload bytes."""
        nbytes = sum(t.numel() * t.element_size() for t in s.tensors)
        if s.dst == self.rank:
            # a hand-off between two stages of this worker (interleaved chunks): no transfer
            self._local[(self.rank, s.tag)] = [t.detach() for t in s.tensors]
            return nbytes
        wire_tag = self._in_order(0, s.dst, s.tag)
        buf = pack(s.tensors)
        if buf.device != self.wire:      # device-to-host copy (synchronous: the buffer is complete)
            buf = buf.to(self.wire)
        work = dist.isend(buf, dst=s.dst, tag=wire_tag, group=self._lane(self.rank, s.dst))
        self._sends[(s.dst, s.tag)] = (work, buf)
        return nbytes

    def retire(self, keys: Sequence[tuple[int, int]]) -> None:
        """Wait for the outstanding sends ``keys`` (only those the receiver surely took: a gloo send
        completes once its receive is posted, and says so only when waited on) and drop their buffers."""
        for k in keys:
            ws = self._sends.pop(k, None)
            if ws is not None:
                ws[0].wait()

    def allreduce(self, stage: int, flat: torch.Tensor) -> torch.Tensor:
        """Sum ``flat`` over the replicas of ``stage`` (in place); returns it."""
        buf = flat if flat.device == self.wire else flat.to(self.wire)     # through host memory
        dist.all_reduce(buf, group=self.groups[stage])
        if buf is not flat:
            flat.copy_(buf)
        return flat

    def held(self) -> list[torch.Tensor]:
        """The message buffers held right now: posted receives, unretired sends, local hand-offs."""
        out = [buf for _, buf, _ in self._posted.values()] + [buf for _, buf in self._sends.values()]
        return out + [t for ts in self._local.values() for t in ts]

    def flush(self) -> None:
        """Wait for every outstanding send."""
        for w, _ in self._sends.values():
            w.wait()
        self._sends.clear()


class Mailbox:
    """The reference executor's transport: messages wait in a dict until their action runs."""

    def __init__(self) -> None:
        self.box: dict[tuple[int, int, int], list[torch.Tensor]] = {}

    def put(self, src: int, s: Send) -> int:
        """Deliver ``s`` from ``src`` (copies, as a real transfer would)."""
        self.box[(src, s.dst, s.tag)] = [t.detach().clone() for t in s.tensors]
        return sum(t.numel() * t.element_size() for t in s.tensors)

    def ready(self, dst: int, r: Recv) -> bool:
        """Whether ``r``'s message for ``dst`` has arrived."""
        return (r.src, dst, r.tag) in self.box

    def held(self, dst: int) -> list[torch.Tensor]:
        """The messages waiting for ``dst``."""
        return [t for (_, d, _), ts in self.box.items() if d == dst for t in ts]

    def take(self, dst: int, r: Recv) -> list[torch.Tensor]:
        """Remove and return ``r``'s message for ``dst``."""
        return self.box.pop((r.src, dst, r.tag))

"""The Cluster record: devices arranged in a hierarchy of interconnect levels.

Levels are innermost first: ``levels[0]`` groups ``levels[0].size`` consecutive workers (the GPUs of a
server), ``levels[1]`` groups that many of those blocks, and so on; ``prod(level.size) == num_workers``.
A transfer crosses the link of the innermost level whose block holds both workers. ``Device.speed`` is
throughput relative to the profiled device; bandwidths are bytes/s per direction, latencies seconds.
The presets, their sources and their ``transport`` options: ``docs/clusters.md``.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from pipelab._display import Described
from pipelab._io import read_record, write_record
from pipelab.measured import Calibration
from pipelab.transports import (
    GLOO_ALLREDUCE_BUS_BANDWIDTH,
    HOST_COPY_BYTES_PER_S,
    NCCL_TCP_BUS_BANDWIDTH,
    nccl_flat_ring,
    transport_levels,
)

GB = 1e9
Gbps = 1e9 / 8
#: :attr:`Cluster.allreduce_ring` values
ALLREDUCE_RINGS = ("hierarchical", "flat")
CLUSTER_SCHEMA = 1


@dataclass(frozen=True)
class Device:
    """One accelerator: a name, its speed relative to the profiled device, its memory in bytes."""

    name: str
    speed: float = 1.0
    memory_bytes: int = 16 * 2**30

    def __post_init__(self) -> None:
        if not (isinstance(self.speed, (int, float)) and math.isfinite(self.speed) and self.speed > 0):
            raise ValueError(f"device {self.name!r}: speed={self.speed!r} must be a positive finite number "
                             f"(1.0 = the device the profile was measured on)")
        if not isinstance(self.memory_bytes, int) or self.memory_bytes <= 0:
            raise ValueError(f"device {self.name!r}: memory_bytes={self.memory_bytes!r} must be a positive "
                             "int")


@dataclass(frozen=True)
class Level:
    """One interconnect level: ``size`` sub-blocks per block, joined by links of ``bandwidth`` B/s.

    ``uplinks``: parallel links per sub-block (e.g. 8 InfiniBand adapters per DGX server), which a
    collective may use at once. ``p2p_bandwidth`` and ``allreduce_bandwidth`` override ``bandwidth``
    for pipeline transfers and ring all-reduces where a transport differs from the link.
    """

    name: str
    size: int
    bandwidth: float
    latency: float = 0.0
    uplinks: int = 1
    p2p_bandwidth: float | None = None
    allreduce_bandwidth: float | None = None

    def __post_init__(self) -> None:
        for label in ("p2p_bandwidth", "allreduce_bandwidth"):
            v = getattr(self, label)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"level {self.name!r}: {label}={v!r} must be None (the link's bandwidth) "
                                 f"or a finite number of bytes/s > 0")
        if not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"level {self.name!r}: size={self.size!r} must be an integer >= 1")
        bw = self.bandwidth
        if not (isinstance(bw, (int, float)) and bw > 0 and not math.isnan(bw)):
            raise ValueError(f"level {self.name!r}: bandwidth={self.bandwidth!r} must be > 0 bytes/s")
        if not (isinstance(self.latency, (int, float)) and math.isfinite(self.latency) and self.latency >= 0):
            raise ValueError(f"level {self.name!r}: latency={self.latency!r} must be a finite number >= 0 s")
        if not isinstance(self.uplinks, int) or self.uplinks < 1:
            raise ValueError(f"level {self.name!r}: uplinks={self.uplinks!r} must be an integer >= 1")

    @property
    def transfer_bandwidth(self) -> float:
        """Bytes/s of one pipeline transfer at this level (the one rate the cost model's transfers use)."""
        return self.bandwidth if self.p2p_bandwidth is None else float(self.p2p_bandwidth)

    @property
    def ring_bandwidth(self) -> float:
        """Bytes/s per link inside a ring all-reduce at this level."""
        return self.bandwidth if self.allreduce_bandwidth is None else float(self.allreduce_bandwidth)


#: a V100 PCIe card's speed over a V100 SXM2 module's: 14 against 15.7 TFLOPS FP32 (Tesla V100 datasheet)
V100_PCIE_OVER_SXM2 = 14.0 / 15.7
#: NCCL all-reduce bus bandwidth (bytes/s) between the V100 PCIe GPUs of an Azure NCv3 VM (cluster A's
#: family): nccl-tests' all_reduce_perf, 64 MB to 2 GB (marconetto/azadventures, chapter18/README.md)
NCCL_NCV3_PCIE_BUS_BANDWIDTH = 6.88e9
#: NCCL's measured all-reduce bus bandwidth by preset and level name, where it is not the link's rate
NCCL_MEASURED_BUS_BANDWIDTH: dict[str, dict[str, float]] = {
    "pipedream-a": {"pcie": NCCL_NCV3_PCIE_BUS_BANDWIDTH},
}
#: values of :meth:`Cluster.preset`'s ``transport``
PRESET_TRANSPORTS = ("link", "pipedream", "nccl")



def _rate(device: str, quantity: str) -> float:
    """A cited rate of ``device`` from ``pipelab/data/devices.csv`` (its ``source`` column cites it)."""
    text = resources.files("pipelab").joinpath("data/devices.csv").read_text(encoding="utf-8")
    for row in csv.DictReader(text.splitlines()):
        if row["device"] == device and row["quantity"] == quantity:
            return float(row["value"])
    raise KeyError(f"devices.csv has no {quantity} for {device}")


# preset name -> (device, gpus per server, default servers, inner level (or None), outer level); the
# dgx presets' all-reduce rates are NCCL's measured bus bandwidths (devices.csv)
_V100 = Device("V100-16GB", 1.0, 16 * 2**30)
_PRESETS: dict[str, tuple[Device, int, int, Level | None, Level]] = {
    "pipedream-a": (_V100, 4, 4, Level("pcie", 4, 10 * GB, 5e-6),
                    Level("ethernet-10g", 4, 10 * Gbps, 25e-6)),
    "pipedream-b": (_V100, 8, 2, Level("nvlink", 8, 50 * GB, 5e-6),
                    Level("ethernet-25g", 2, 25 * Gbps, 25e-6)),
    "pipedream-c": (Device("TitanX-12GB", 1.0, 12 * 2**30), 1, 4, None,
                    Level("ethernet-40g", 4, 40 * Gbps, 10e-6)),
    "dgx-h100": (Device("H100-80GB", 1.0, 80 * 2**30), 8, 2,
                 Level("nvlink4", 8, 450 * GB, 3e-6,
                       allreduce_bandwidth=_rate("H100-SXM5-80GB", "nvlink_busbw")),
                 Level("infiniband-400g", 2, 400 * Gbps, 2e-6, uplinks=8,
                       allreduce_bandwidth=_rate("H100-SXM5-80GB", "nic_busbw"))),
    "dgx-a100": (Device("A100-SXM4-80GB", 1.0, 80 * 2**30), 8, 2,
                 Level("nvlink3", 8, 300 * GB, 3e-6,
                       allreduce_bandwidth=_rate("A100-SXM4-80GB", "nvlink_busbw")),
                 Level("infiniband-200g", 2, 200 * Gbps, 2e-6, uplinks=8,
                       allreduce_bandwidth=_rate("A100-SXM4-80GB", "nic_busbw"))),
    "a100-ib": (Device("A100-80GB", 1.0, 80 * 2**30), 8, 2, Level("nvlink3", 8, 300 * GB, 3e-6),
                Level("infiniband-200g", 2, 200 * Gbps, 2e-6, uplinks=8)),
}

# HetPipe ATC'20 §6 GPU types; speed relative to TITAN V from FP32 peak TFLOPS (vendor data sheets)
HETPIPE_DEVICES: dict[str, Device] = {"V": Device("TITAN-V", 1.0, 12 * 2**30),
                                      "R": Device("TITAN-RTX", 16.3 / 14.9, 24 * 2**30),
                                      "G": Device("RTX-2060", 6.5 / 14.9, 6 * 2**30),
                                      "Q": Device("Quadro-P4000", 5.3 / 14.9, 8 * 2**30)}


@dataclass(frozen=True, repr=False)
class Cluster(Described):
    """Devices (one per worker) in a hierarchy of levels, innermost first."""

    name: str
    levels: tuple[Level, ...]
    devices: tuple[Device, ...]
    #: what :func:`pipelab.calibrate.calibrate` measured, when the cluster is a calibrated machine
    calibration: Calibration | None = None
    #: ``"hierarchical"`` (a ring per level) or ``"flat"`` (one ring through the group in rank order,
    #: over the slowest level it crosses: gloo's)
    allreduce_ring: str = "hierarchical"

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        object.__setattr__(self, "devices", tuple(self.devices))
        if self.allreduce_ring not in ALLREDUCE_RINGS:
            raise ValueError(f"cluster {self.name!r}: allreduce_ring={self.allreduce_ring!r} must be one of "
                             f"{ALLREDUCE_RINGS}")
        if not self.devices:
            raise ValueError(f"cluster {self.name!r} has zero workers; give at least one device")
        if not self.levels:
            raise ValueError(f"cluster {self.name!r} needs at least one level (Cluster.flat: one switch)")
        n = math.prod(lv.size for lv in self.levels)
        if n != len(self.devices):
            sizes = " x ".join(str(lv.size) for lv in self.levels)
            raise ValueError(f"cluster {self.name!r}: level sizes {sizes} multiply to {n} but there are "
                             f"{len(self.devices)} devices; give one device per worker")

    @property
    def num_workers(self) -> int:
        """Number of workers (devices)."""
        return len(self.devices)

    def _check(self, w: int) -> None:
        if not (0 <= w < len(self.devices)):
            raise ValueError(f"worker {w} is outside 0..{len(self.devices) - 1} of cluster {self.name!r}")

    def speed(self, w: int) -> float:
        """Relative speed of worker ``w``'s device."""
        self._check(w)
        return self.devices[w].speed

    def memory(self, w: int) -> int:
        """Memory in bytes of worker ``w``'s device."""
        self._check(w)
        return self.devices[w].memory_bytes

    def block_size(self, k: int) -> int:
        """Workers in one level-``k`` block (``prod`` of sizes of levels ``0..k``); 1 for ``k == -1``."""
        return math.prod(lv.size for lv in self.levels[: k + 1])

    def ring_levels(self, workers: Sequence[int]) -> list[tuple[Level, int, int]]:
        """The levels a hierarchical ring over ``workers`` crosses, each as ``(level, p, links)``: ``p``
        blocks of the level below take part in its ring, over ``links`` of its uplinks at once."""
        ws = sorted(set(int(w) for w in workers))
        for w in ws:
            self._check(w)
        out = []
        for k, lv in enumerate(self.levels):
            inner, outer = self.block_size(k - 1), self.block_size(k)
            blocks: dict[int, set[int]] = {}
            for w in ws:
                blocks.setdefault(w // outer, set()).add(w // inner)
            p = max((len(b) for b in blocks.values()), default=1)
            if p > 1:
                out.append((lv, p, min(lv.uplinks, max(Counter(w // inner for w in ws).values()))))
        return out

    def level_between(self, a: int, b: int) -> int:
        """Index of the innermost level whose block contains both ``a`` and ``b``; -1 if ``a == b``."""
        self._check(a)
        self._check(b)
        if a == b:
            return -1
        block = 1
        for k, lv in enumerate(self.levels):
            block *= lv.size
            if a // block == b // block:
                return k
        raise AssertionError("unreachable: the outermost level holds every worker")

    def link(self, a: int, b: int) -> Level:
        """The level whose link a transfer ``a -> b`` crosses (``a != b``)."""
        k = self.level_between(a, b)
        if k < 0:
            raise ValueError(f"link({a}, {b}): a worker does not send to itself over a link")
        return self.levels[k]

    def subset(self, workers: Sequence[int]) -> Cluster:
        """The cluster of the given workers, in their hierarchy: a regular sub-grid (whole blocks of a
        level, or part of one block), else ``ValueError``."""
        ws = sorted(set(int(w) for w in workers))
        if not ws:
            raise ValueError("workers= selects zero workers; pick at least one")
        for w in ws:
            self._check(w)
        devices = tuple(self.devices[w] for w in ws)
        if len(ws) == 1:
            return Cluster(f"{self.name}[{ws[0]}]", (Level("local", 1, self.levels[0].bandwidth),), devices)
        levels: list[Level] = []
        for k, lv in enumerate(self.levels):
            inner, outer = self.block_size(k - 1), self.block_size(k)
            groups: dict[int, set[int]] = {}
            for w in ws:
                groups.setdefault(w // outer, set()).add(w // inner)
            sizes = {len(g) for g in groups.values()}
            if len(sizes) != 1:
                raise ValueError(f"workers {ws} are not a regular sub-grid of cluster {self.name!r} at level "
                                 f"{lv.name!r}; choose whole servers or GPUs inside one server")
            levels.append(replace(lv, size=sizes.pop()))
        if math.prod(lv.size for lv in levels) != len(ws):
            raise ValueError(f"workers {ws} are not a regular sub-grid of cluster {self.name!r}; "
                             f"choose the same number of GPUs in each chosen server")
        return Cluster(f"{self.name}[{len(ws)}]", tuple(levels), devices, allreduce_ring=self.allreduce_ring)

    @classmethod
    def flat(cls, workers: int, bandwidth: float = 10 * GB, memory: int = 16 * 2**30, latency: float = 0.0,
             speed: float = 1.0, *, name: str | None = None, device: str = "gpu") -> Cluster:
        """``workers`` identical devices behind one switch (a single level)."""
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers={workers!r}: a cluster needs at least one worker")
        dev = Device(device, speed, int(memory))
        level = Level("switch", workers, bandwidth, latency)
        return cls(name or f"flat:{workers}", (level,), (dev,) * workers)

    @classmethod
    def preset(cls, name: str, *, servers: int | None = None, gpus_per_server: int | None = None,
               speed: float | None = None, memory: int | None = None, transport: str = "link",
               nodes: int | None = None) -> Cluster:
        """A named cluster (``docs/clusters.md``: the table, the sources and the transports).

        Args:
            speed: the devices' speed relative to the profiled device (default 1.0: the same type).
            transport: ``"link"`` (the raw links), ``"pipedream"`` (PipeDream's gloo runtime) or ``"nccl"``
                (a data-parallel run on NCCL: one flat ring at NCCL's measured bus bandwidths).
            nodes: another name for ``servers``.
        """
        if nodes is not None:
            if servers is not None and servers != nodes:
                raise ValueError(f"servers={servers} and nodes={nodes} disagree; give one of them")
            servers = nodes
        if transport not in PRESET_TRANSPORTS:
            raise ValueError(f"transport={transport!r} is not one of {PRESET_TRANSPORTS}")
        key = name.lower()
        if key == "hetpipe":
            return cls.hetpipe(servers=servers or 4, gpus_per_server=gpus_per_server or 4)
        if key not in _PRESETS:
            raise ValueError(f"unknown cluster preset {name!r}; choose one of "
                             f"{', '.join([*_PRESETS, 'hetpipe'])} or build one with Cluster.flat / "
                             f"Cluster(...)")
        dev, g0, s0, inner, outer = _PRESETS[key]
        g = g0 if gpus_per_server is None else gpus_per_server
        s = s0 if servers is None else servers
        for label, v in (("servers", s), ("gpus_per_server", g)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{label}={v!r} must be an integer >= 1")
        if inner is None and g != 1:
            raise ValueError(f"preset {name!r} has one GPU per server; use servers=N "
                             f"(got gpus_per_server={g})")
        if speed is not None or memory is not None:
            dev = Device(dev.name, dev.speed if speed is None else speed,
                         dev.memory_bytes if memory is None else int(memory))
        levels = [] if inner is None else [replace(inner, size=g)]
        levels.append(replace(outer, size=s, uplinks=min(outer.uplinks, g)))
        tag = f"{key}:{s}x{g}" if inner is not None else f"{key}:{s}"
        cluster = cls(tag, tuple(levels), (dev,) * (s * g))
        if transport == "pipedream":
            return cluster.with_transport("gloo-host", "gloo-ring")
        if transport == "nccl":
            bus = {**NCCL_TCP_BUS_BANDWIDTH, **NCCL_MEASURED_BUS_BANDWIDTH.get(key, {})}
            nccl = cluster.with_transport("link", "nccl-ring", allreduce_bus_bandwidth=bus)
            return replace(nccl, name=nccl.name + "[flat]", levels=nccl_flat_ring(nccl.levels))
        return cluster

    @staticmethod
    def presets() -> tuple[str, ...]:
        """Names accepted by :meth:`preset` and :meth:`parse`."""
        return (*_PRESETS, "hetpipe")

    @classmethod
    def of(cls, cluster: Cluster | str) -> Cluster:
        """``cluster`` itself, or the cluster a spec string names (:meth:`parse`)."""
        if isinstance(cluster, Cluster):
            return cluster
        if isinstance(cluster, str):
            return cls.parse(cluster)
        raise TypeError(f"cluster must be a Cluster or a spec string such as 'flat:2' or 'pipedream-a:4x4', "
                        f"got {type(cluster).__name__}")

    @classmethod
    def parse(cls, spec: str) -> Cluster:
        """``"pipedream-a:4x4"`` (servers x GPUs), ``"pipedream-c:8"`` (servers), ``"flat:16"``, a name,
        or the path of a cluster JSON (``pipelab calibrate -o cluster.json``)."""
        if spec.strip().endswith(".json"):
            return cls.load(spec.strip())
        m = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)\s*(?::\s*(\d+)\s*(?:[xX]\s*(\d+))?)?\s*", spec)
        if not m:
            raise ValueError(f"cannot read cluster spec {spec!r}; write e.g. 'pipedream-a:4x4' "
                             f"(servers x GPUs)")
        name, a, b = m.group(1), m.group(2), m.group(3)
        if name.lower() == "flat":
            if a is None or b is not None:
                raise ValueError(f"write a flat cluster as 'flat:N' (N workers), not {spec!r}")
            return cls.flat(int(a))
        if a is None:
            return cls.preset(name)
        if b is not None:
            return cls.preset(name, servers=int(a), gpus_per_server=int(b))
        key = name.lower()
        g0 = _PRESETS[key][1] if key in _PRESETS else 4
        n = int(a)
        if g0 == 1:
            return cls.preset(name, servers=n)
        if n <= g0:
            return cls.preset(name, servers=1, gpus_per_server=n)
        if n % g0:
            raise ValueError(f"{spec!r}: {n} GPUs do not fill servers of {g0}; write 'SERVERSxGPUS'")
        return cls.preset(name, servers=n // g0, gpus_per_server=g0)

    @classmethod
    def heterogeneous(cls, servers: Sequence[Sequence[Device]], *, intra: Level, inter: Level,
                      name: str = "heterogeneous") -> Cluster:
        """Servers given as lists of devices (same count per server); ``intra``/``inter``'s sizes are set."""
        if not servers:
            raise ValueError("heterogeneous cluster needs at least one server")
        per = {len(s) for s in servers}
        if len(per) != 1 or 0 in per:
            raise ValueError(f"every server needs the same (non-zero) number of devices; got "
                             f"{[len(s) for s in servers]}")
        g = per.pop()
        levels = (replace(intra, size=g),
                  replace(inter, size=len(servers), uplinks=min(inter.uplinks, g)))
        return cls(name, levels, tuple(d for s in servers for d in s))

    @classmethod
    def hetpipe(cls, *, servers: int = 4, gpus_per_server: int = 4, types: str = "VRGQ") -> Cluster:
        """HetPipe's cluster (ATC'20 §6): one GPU type per node, cycling through ``types`` (V,R,G,Q)."""
        if servers < 1 or gpus_per_server < 1:
            raise ValueError("servers and gpus_per_server must be >= 1")
        bad = set(types) - set(HETPIPE_DEVICES)
        if bad or not types:
            raise ValueError(f"types={types!r}: use letters from {''.join(HETPIPE_DEVICES)} "
                             f"(TITAN V, TITAN RTX, RTX 2060, Quadro P4000)")
        nodes = [[HETPIPE_DEVICES[types[i % len(types)]]] * gpus_per_server for i in range(servers)]
        return cls.heterogeneous(nodes, intra=Level("pcie", gpus_per_server, 10 * GB, 5e-6),
                                 inter=Level("infiniband-56g", servers, 56 * Gbps, 2e-6),
                                 name=f"hetpipe:{servers}x{gpus_per_server}")

    def with_transport(self, pipeline: str = "link", allreduce: str = "link", *,
                       host_copy_bandwidth: float = HOST_COPY_BYTES_PER_S,
                       allreduce_bus_bandwidth: dict[str, float] | None = None,
                       gloo_allreduce_bandwidth: float = GLOO_ALLREDUCE_BUS_BANDWIDTH) -> Cluster:
        """This cluster with its transfers priced by a transport (:mod:`pipelab.transports`).

        Args:
            pipeline: ``"link"`` or ``"gloo-host"`` (device -> host copy, TCP, host -> device copy).
            allreduce: ``"link"``, ``"nccl-ring"`` (the levels named in ``allreduce_bus_bandwidth`` at
                NCCL's bus bandwidth) or ``"gloo-ring"`` (one flat ring on the host).
        """
        levels = transport_levels(self.levels, pipeline, allreduce, host_copy_bandwidth=host_copy_bandwidth,
                                  allreduce_bus_bandwidth=allreduce_bus_bandwidth,
                                  gloo_allreduce_bandwidth=gloo_allreduce_bandwidth)
        tag = "" if (pipeline, allreduce) == ("link", "link") else f"[{pipeline},{allreduce}]"
        ring = "flat" if allreduce == "gloo-ring" else self.allreduce_ring
        return replace(self, name=self.name + tag, levels=tuple(levels), allreduce_ring=ring)

    @property
    def homogeneous(self) -> bool:
        """True when every device is identical."""
        return len(set(self.devices)) == 1

    def describe(self) -> str:
        """A few lines for humans: workers, devices, levels with bandwidths."""
        devs = ", ".join(f"{n} x {d.name} (speed {d.speed:.2f}, {d.memory_bytes / 2**30:.0f} GiB)"
                         for d, n in Counter(self.devices).items())
        lines = [f"Cluster {self.name!r}: {self.num_workers} workers: {devs}"]
        for k, lv in enumerate(self.levels):
            up = f", {lv.uplinks} uplinks" if lv.uplinks > 1 else ""
            rates = (("transfers at", lv.p2p_bandwidth), ("all-reduce bus", lv.allreduce_bandwidth))
            via = "".join(f", {what} {bw / GB:.3g} GB/s" for what, bw in rates if bw is not None)
            lines.append(f"  level {k} {lv.name}: {lv.size} per block, {lv.bandwidth / GB:.3g} GB/s "
                         f"({lv.bandwidth * 8 / 1e9:.3g} Gbps), latency {lv.latency * 1e6:.3g} us{up}{via}")
        if self.allreduce_ring == "flat":
            lines.append("  all-reduce: one flat ring through a group's workers (slowest level crossed)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form."""
        d: dict[str, Any] = {"name": self.name, "levels": [asdict(lv) for lv in self.levels],
                             "devices": [asdict(dv) for dv in self.devices]}
        if self.calibration is not None:
            d["calibration"] = self.calibration.to_dict()
        if self.allreduce_ring != "hierarchical":
            d["allreduce_ring"] = self.allreduce_ring
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cluster:
        """Inverse of :meth:`to_dict`."""
        try:
            cal = d.get("calibration")
            return cls(d["name"], tuple(Level(**lv) for lv in d["levels"]),
                       tuple(Device(**dv) for dv in d["devices"]),
                       Calibration.from_dict(cal) if cal is not None else None,
                       allreduce_ring=d.get("allreduce_ring", "hierarchical"))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"malformed cluster dict ({exc}); produce it with Cluster.to_dict()") from None

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the cluster as JSON, atomically (``Cluster.load`` reads it back)."""
        return write_record(path, "cluster", CLUSTER_SCHEMA, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Cluster:
        """Read a cluster written by :meth:`save` (e.g. by ``pipelab calibrate``)."""
        return cls.from_dict(read_record(path, "cluster", CLUSTER_SCHEMA))

    def with_workers(self, workers: int) -> Cluster:
        """The same machine with ``workers`` workers on one switch (first device, innermost link)."""
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers={workers!r} must be an integer >= 1")
        lv = self.levels[0]
        return replace(self, name=f"{self.name.split(':')[0]}:{workers}",
                       levels=(replace(lv, size=workers),),
                       devices=(self.devices[0],) * workers)

"""The papers' reproductions: ``pipelab reproduce`` / ``make reproduce``, and the helpers their notebooks call.

Each claim lives in a folder of ``reproductions/`` with a README (claim, set-up, the paper's numbers),
a papermill notebook, and the results it wrote. :func:`main` runs every notebook at sizes that fit
a laptop CPU in about ten minutes (tqdm progress bar), writes the tables and reports, and prints the
PipeDream Table 1 comparison at the end.

The notebooks stay thin: what they compute is here (typed, tested, importable by worker processes,
which a function defined inside a notebook is not).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelab._io import atomic_write_text

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go
    import torch
    from torch import nn

    from pipelab.cluster import Cluster
    from pipelab.partition.plan import Plan
    from pipelab.profile.records import Profile

REPRODUCTIONS = Path(__file__).resolve().parents[1] / "reproductions"

# =========================================================================== PipeDream Table 1


@dataclass(frozen=True)
class PaperRow:
    """One row of PipeDream's Table 1 (Narayanan et al., SOSP'19): the config it chose and its
    speed-up over data parallelism in epoch time (the "Epoch time" column, not time-to-accuracy)."""

    model: str
    cluster: str
    servers: int
    gpus_per_server: int
    config: str
    speedup: float | None     # None: not known to us

    @property
    def workers(self) -> int:
        """Servers times GPUs per server."""
        return self.servers * self.gpus_per_server

    @property
    def key(self) -> str:
        """``vgg16/pipedream-a/4x4``."""
        return f"{self.model}/{self.cluster}/{self.servers}x{self.gpus_per_server}"

    def describe(self) -> str:
        """``VGG-16 on cluster A 4x4: 15-1, 5.28x over DP``."""
        sp = f"{self.speedup:g}x" if self.speedup is not None else "speed-up unknown"
        return f"{self.model} on {self.cluster} {self.servers}x{self.gpus_per_server}: {self.config}, {sp} over DP"


#: PipeDream (Narayanan et al., SOSP'19), Table 1, "Speedup over DP, epoch time". The GNMT-16 A 4x4
#: row (straight, 2.34x) is as we read the paper's table; the issue's list left it open.
TABLE1: tuple[PaperRow, ...] = (
    PaperRow("vgg16", "pipedream-a", 4, 4, "15-1", 5.28),
    PaperRow("vgg16", "pipedream-b", 2, 8, "15-1", 2.98),
    PaperRow("resnet50", "pipedream-a", 4, 4, "16", 1.0),
    PaperRow("resnet50", "pipedream-b", 2, 8, "16", 1.0),
    PaperRow("gnmt8", "pipedream-a", 1, 4, "straight", 1.5),
    PaperRow("gnmt8", "pipedream-a", 3, 4, "straight", 2.95),
    PaperRow("gnmt8", "pipedream-b", 2, 8, "16", 1.0),
    PaperRow("gnmt16", "pipedream-a", 1, 4, "straight", 1.46),
    PaperRow("gnmt16", "pipedream-a", 4, 4, "straight", 2.34),
    PaperRow("gnmt16", "pipedream-b", 2, 8, "straight", 3.14),
)


def paper_row(model: str, cluster: str, servers: int, gpus_per_server: int) -> PaperRow | None:
    """The Table 1 row for this model and cluster, or ``None`` when the paper has none."""
    for row in TABLE1:
        if (row.model, row.cluster, row.servers, row.gpus_per_server) == (model, cluster, servers, gpus_per_server):
            return row
    return None


def config_shape(config: str) -> str:
    """The shape of a config in the paper's notation.

    ``"dp"`` (one number: every worker a replica of the whole model), ``"straight"`` (several stages,
    one worker each), ``"replicated-front"`` (a replicated first stage and a single-worker last stage,
    like VGG-16's ``15-1``), or ``"hybrid"`` (anything else).
    """
    if config == "straight":
        return "straight"
    parts = config.split("-")
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"config {config!r} is not in the paper's notation ('15-1', 'straight', '16')")
    if len(parts) == 1:
        return "dp"
    reps = [int(p) for p in parts]
    if reps[0] > 1 and reps[-1] == 1:
        return "replicated-front"
    return "hybrid"


def table1_row(*, model: str, cluster: str, servers: int, gpus_per_server: int, plan: Plan,
               predicted_speedup: float, simulated_speedup: float, profile_source: str = "pipedream",
               dp_terms: pd.DataFrame | None = None, sim_ms: tuple[float, float] | None = None) -> dict[str, Any]:
    """One result row: our config and speed-ups beside the paper's, the error and whether the shape matches.

    With ``dp_terms`` (:func:`cost_terms` of the data-parallel plan) the row also carries the share of
    a data-parallel step spent in all-reduce that backward cannot hide, the term that decides most rows;
    ``sim_ms`` are the simulated seconds per minibatch of the plan and of data parallelism.
    """
    paper = paper_row(model, cluster, servers, gpus_per_server)
    row: dict[str, Any] = {
        "model": model, "cluster": cluster, "servers_x_gpus": f"{servers}x{gpus_per_server}",
        "profile": profile_source, "config": plan.config, "stages": plan.num_stages,
        "predicted_speedup": round(float(predicted_speedup), 3), "simulated_speedup": round(float(simulated_speedup), 3),
        "paper_config": paper.config if paper else "", "paper_speedup": paper.speedup if paper else None,
    }
    if sim_ms is not None:
        row["sim_plan_ms"], row["sim_dp_ms"] = round(sim_ms[0] * 1e3, 2), round(sim_ms[1] * 1e3, 2)
    if dp_terms is not None:
        t = dp_terms.iloc[0]
        row["dp_exposed_comm_share"] = round(float(t["exposed_comm_ms"] / t["replica_ms"]), 3)
        if paper is not None and paper.speedup and sim_ms is not None:
            # If our plan's time were right, the paper's speed-up says DP took paper_speedup times
            # as long per minibatch; all beyond its compute is communication it could not hide.
            implied_dp = paper.speedup * sim_ms[0]
            compute = float(t["compute_ms"]) / 1e3 / int(t["replicas"])
            row["paper_implied_dp_comm_share"] = round(max(0.0, 1 - compute / implied_dp), 3)
    if paper is not None:
        row["shape_matches"] = config_shape(plan.config) == config_shape(paper.config)
        if paper.speedup:
            err = simulated_speedup / paper.speedup - 1.0
            row["error"] = round(err, 3)
            row["within_25pct"] = abs(err) <= 0.25
    return row


def cost_terms(profile: Profile, cluster: Cluster, plan: Plan) -> pd.DataFrame:
    """Per stage, the cost-model terms behind a plan's prediction (ms per minibatch of one replica).

    ``compute_ms`` forward + backward; ``allreduce_ms`` the all-reduce of the stage's weights over its
    replicas; ``replica_ms`` one replica's minibatch with that all-reduce overlapped with backward
    (``CostModel.replica_time_s``); ``exposed_comm_ms`` what of the all-reduce the overlap cannot hide;
    ``in_ms`` the transfer of the activations entering the stage (and, the same size, of the gradient
    going back); ``per_minibatch_ms`` = replica time / replicas, the stage's share of the pipeline's
    steady-state time. These are the numbers that decide which plan wins.
    """
    import pandas as pd

    from pipelab.sim.costs import CostModel

    cm = CostModel(profile, cluster)
    phys = [int(w) for w in plan.notes.get("workers", range(plan.num_workers))]
    rows = []
    for st in plan.stages:
        ws = [phys[r] for r in st.ranks]
        f, b = cm.compute_s(st.start, st.end, ws[0])
        rep = cm.replica_time_s(st.start, st.end, ws)
        ar = cm.allreduce_s(cm.param_bytes(st.start, st.end), ws)
        prev = plan.stages[st.index - 1] if st.index else None
        t_in = cm.transfer_s(cm.cut_bytes(st.start - 1), phys[prev.ranks[-1]], ws[0]) if prev else 0.0
        rows.append({"stage": st.index, "layers": f"[{st.start}, {st.end})", "replicas": st.replicas,
                     "weights_MB": round(cm.param_bytes(st.start, st.end) / 1e6, 1),
                     "compute_ms": round((f + b) * 1e3, 2), "allreduce_ms": round(ar * 1e3, 2),
                     "replica_ms": round(rep * 1e3, 2), "exposed_comm_ms": round((rep - f - b) * 1e3, 2),
                     "in_ms": round(t_in * 1e3, 2), "per_minibatch_ms": round(rep / st.replicas * 1e3, 2)})
    return pd.DataFrame(rows)


def write_row(path: str | os.PathLike[str], row: Mapping[str, Any]) -> Path:
    """Write a result row as JSON (atomically)."""
    return atomic_write_text(path, json.dumps(dict(row), indent=1, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def simulate_plan(plan: Plan, profile: Profile, cluster: Cluster, *, minibatches: int) -> Any:
    """Simulate a plan with the method its shape implies: ``dp`` for one stage, else ``pipedream``."""
    import pipelab as pl

    method = "dp" if plan.num_stages == 1 else "pipedream"
    # PipeDream pairs the replicas' k-th updates in the all-reduce of a replicated stage, so every
    # replica needs as many minibatches: round up to a multiple of every stage's replica count.
    if method == "pipedream":
        step = math.lcm(*plan.replicas)
        minibatches = -(-minibatches // step) * step
    return pl.simulate(plan, profile, cluster, method=method, minibatches=minibatches)


# =========================================================================== models for measure mode


def paper_model(name: str, *, batch: int, image_size: int = 64, seq_len: int = 16,
                width: float = 1.0, vocab: int = 1000) -> tuple[nn.Module, Any]:
    """A paper model (``vgg16``, ``resnet50``, ``gnmt8``, ``gnmt16``) and a sample input batch.

    ``width < 1`` narrows it (channels / hidden sizes) keeping the layer structure, so that the same
    question runs on a laptop CPU; see :func:`reduced_model`.
    """
    net = reduced_model(name, width=width, image_size=image_size, vocab=vocab)
    return net, sample_input(name, batch=batch, image_size=image_size, seq_len=seq_len, vocab=vocab)


def reduced_model(name: str, *, width: float = 1.0, image_size: int = 224, vocab: int = 1000,
                  num_classes: int = 1000) -> nn.Module:
    """``name`` with every channel / hidden size multiplied by ``width``; the layer structure is the paper's.

    VGG-16 keeps torchvision's 13 conv + 3 fully connected layers (feature widths 64..512 times
    ``width``, classifier hidden 4096 times ``width``); ResNet-50 keeps its 16 bottleneck blocks
    ([3, 4, 6, 3]); GNMT keeps its 8 or 16 LSTM layers with ``hidden = 1024 * width``.
    At ``width=1`` these are the paper's models.
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    if not 0 < width <= 1:
        raise ValueError(f"width={width} must be in (0, 1]")
    if name == "vgg16":
        if width == 1.0:
            from pipelab.models import vgg16

            return vgg16(num_classes=num_classes)
        # torchvision's VGG-16 configuration "D": conv widths, 0 = max-pool
        cfg = [64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0]
        layers: list[nn.Module] = []
        c_in = 3
        for v in cfg:
            if v == 0:
                layers.append(nn.MaxPool2d(2, 2))
            else:
                c = max(4, int(v * width))
                layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(inplace=False)]
                c_in = c
        side = max(1, image_size // 32)
        hidden = max(16, int(4096 * width))
        return nn.Sequential(*layers, nn.AdaptiveAvgPool2d((side, side)), nn.Flatten(),
                             nn.Linear(c_in * side * side, hidden), nn.ReLU(), nn.Dropout(0.5),
                             nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(0.5), nn.Linear(hidden, num_classes))
    if name == "resnet50":
        from torchvision.models.resnet import Bottleneck, ResNet

        net = ResNet(Bottleneck, [3, 4, 6, 3], num_classes=num_classes, width_per_group=max(4, int(64 * width)))
        return net
    if name in ("gnmt8", "gnmt16"):
        from pipelab.models import gnmt

        hidden = max(16, int(1024 * width)) // 2 * 2
        return gnmt(num_layers=8 if name == "gnmt8" else 16, vocab=vocab, hidden=hidden)
    raise ValueError(f"unknown paper model {name!r}; choose vgg16, resnet50, gnmt8 or gnmt16")


def sample_input(name: str, *, batch: int, image_size: int = 224, seq_len: int = 16, vocab: int = 1000,
                 seed: int = 0) -> Any:
    """A deterministic input batch for ``name``: images ``[B,3,S,S]`` or GNMT's ``(src, tgt)`` tokens."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if name in ("gnmt8", "gnmt16"):
        src = torch.randint(2, vocab, (batch, seq_len), generator=g)
        tgt = torch.randint(2, vocab, (batch, seq_len), generator=g)
        return (src, tgt)
    return torch.randn(batch, 3, image_size, image_size, generator=g)


def random_batches(name: str, *, steps: int, batch: int, image_size: int = 224, seq_len: int = 16,
                   vocab: int = 1000, num_classes: int = 1000, seed: int = 0) -> list[tuple[Any, Any]]:
    """``steps`` minibatches of random inputs and labels for ``name`` (a ``data`` callable for ``pl.train``)."""
    import torch

    out = []
    g = torch.Generator().manual_seed(seed + 1)
    for k in range(steps):
        x = sample_input(name, batch=batch, image_size=image_size, seq_len=seq_len, vocab=vocab, seed=seed + k)
        if name in ("gnmt8", "gnmt16"):
            y = torch.randint(2, vocab, (batch, seq_len), generator=g)
        else:
            y = torch.randint(0, num_classes, (batch,), generator=g)
        out.append((x, y))
    return out


def cross_entropy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross entropy for classifier logits ``[B,C]`` and sequence logits ``[B,T,V]`` alike."""
    import torch.nn.functional as F

    if output.dim() == 3:
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return F.cross_entropy(output, target)


# =========================================================================== this machine's network


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pingpong(rank: int, port: int, nbytes: int, repeats: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    buf = torch.zeros(nbytes // 4)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        else:
            dist.recv(buf, 0)
            dist.send(buf, 0)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times[1:]))
    dist.destroy_process_group()


def gloo_loopback_bandwidth(nbytes: int = 16 << 20, repeats: int = 5) -> float:
    """Bytes per second of a gloo point-to-point transfer between two processes on this machine.

    Median of ``repeats`` ping-pongs of ``nbytes`` each way (``2 * nbytes / time``). This is the
    bandwidth of the flat cluster model that measure mode simulates against.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_pingpong, args=(_free_port(), nbytes, repeats, q), nprocs=2, start_method="spawn")
    return 2 * nbytes / float(q.get())


# =========================================================================== measure mode (Table 1)


def _steady_throughput(run: Any, batch: int, warmup: int) -> float:
    """Samples/s of a run after its first ``warmup`` minibatches, from its trace (updates on stage 0)."""
    evs = [e for e in run.trace.compute_events() if e.kind == "U"]
    if not evs:
        return float(run.throughput)
    by_mb: dict[int, float] = {}
    for e in evs:
        by_mb[e.microbatch] = max(by_mb.get(e.microbatch, 0.0), e.end_s)
    ends = sorted(by_mb.values())
    if len(ends) <= warmup + 1:
        return float(run.throughput)
    span = ends[-1] - ends[warmup]
    return (len(ends) - 1 - warmup) * batch / span


def measure_row(model: str, *, workers: int = 2, steps: int = 12, warmup: int = 3, batch: int = 32,
                width: float = 0.125, image_size: int = 32, seq_len: int = 8, backend: str = "gloo",
                rounds: int = 2, bandwidth: float | None = None, seed: int = 0) -> dict[str, Any]:
    """Table 1's question for real on this machine, at reduced scale.

    Profiles the reduced model on this CPU, models the machine as ``Cluster.flat(workers, bandwidth=
    <measured gloo loopback>)``, partitions (PipeDream's DP, and a straight pipeline for contrast), then
    runs each plan and data parallelism with ``pl.train`` (``rounds`` times, alternating; medians)
    and compares measured with simulated speed-ups. ``bandwidth`` (bytes/s) skips the loopback
    measurement (tests).
    """
    import torch

    import pipelab as pl

    vocab = 256
    model_fn = functools.partial(reduced_model, model, width=width, image_size=image_size, vocab=vocab, num_classes=10)
    sample = sample_input(model, batch=batch, image_size=image_size, seq_len=seq_len, vocab=vocab)
    prof = pl.profile(model_fn(), sample, device="cpu", progress=False, model_name=f"{model}-w{width:g}")
    bw = gloo_loopback_bandwidth() if bandwidth is None else float(bandwidth)
    cl = pl.Cluster.flat(workers, bandwidth=bw)
    plans = {"chosen": pl.partition(prof, cl, method="pipedream"),
             "straight": pl.partition(prof, cl, method="pipedream", straight=True),
             "dp": pl.partition(prof, cl, method="dp")}
    opt = functools.partial(torch.optim.SGD, lr=0.01)
    # one run per distinct plan and round, rounds alternating so that load on a shared machine
    # affects every plan alike; the median over rounds is kept
    distinct: dict[str, Plan] = {}
    for plan in plans.values():
        distinct.setdefault(plan.config, plan)
    samples: dict[str, list[float]] = {c: [] for c in distinct}
    for _ in range(rounds):
        for config, plan in distinct.items():
            # As in PipeDream's baseline (and the simulator's dp) every data-parallel replica processes
            # a whole profile minibatch per step: the runtime's dp minibatch is `workers` of them, split.
            method, reps = ("dp", plan.num_workers) if plan.num_stages == 1 else ("pipedream", 1)
            data = functools.partial(random_batches, model, steps=steps + warmup, batch=batch * reps,
                                     image_size=image_size, seq_len=seq_len, vocab=vocab, num_classes=10, seed=seed)
            run = pl.train(model_fn, plan, method=method, data=data, loss_fn=cross_entropy, optimizer=opt,
                           steps=steps + warmup, microbatches=reps, backend=backend, seed=seed, progress=False)
            samples[config].append(_steady_throughput(run, batch * reps, warmup))
    measured = {name: statistics.median(samples[plan.config]) for name, plan in plans.items()}
    simulated = {name: simulate_plan(plan, prof, cl, minibatches=max(24, 4 * workers)).throughput
                 for name, plan in plans.items()}
    out: dict[str, Any] = {"model": f"{model} (width {width:g}, {image_size if model[:4] != 'gnmt' else seq_len})",
                           "workers": workers, "gloo_GBps": round(bw / 1e9, 3)}
    for name in ("chosen", "straight"):
        m = measured[name] / measured["dp"]
        s = simulated[name] / simulated["dp"]
        out.update({f"{name}_config": plans[name].config, f"{name}_measured_speedup": round(m, 3),
                    f"{name}_simulated_speedup": round(s, 3), f"{name}_error": round(s / m - 1, 3)})
    out.update({f"{k}_samples_per_s": round(v, 1) for k, v in measured.items()})
    return out


# =========================================================================== weight stashing


def parse_method(spec: str) -> tuple[str, dict[str, Any]]:
    """``"pipedream+vertical_sync"`` -> ``("pipedream", {"vertical_sync": True})``; ``"buffered:3"`` -> K=3."""
    name, *flags = spec.split("+")
    opts: dict[str, Any] = {f: True for f in flags}
    if ":" in name:
        name, k = name.split(":", 1)
        opts["versions"] = int(k)
    return name, opts


def digits_model(channels: int = 16, state_path: str | None = None) -> nn.Module:
    """The digits CNN (``pl.models.small_cnn``), optionally starting from saved weights (a ``model_fn``)."""
    import torch

    from pipelab.models import small_cnn

    torch.manual_seed(0)
    net = small_cnn(channels=channels)
    if state_path:
        net.load_state_dict(torch.load(state_path, weights_only=True))
    return net


def digits_epoch(epoch: int, *, batch_size: int = 32, seed: int = 0, limit: int = 0) -> list[tuple[Any, Any]]:
    """Epoch ``epoch`` of the digits training split as minibatches, shuffled reproducibly (a ``data`` callable).

    Only whole minibatches are returned, so every minibatch splits into equal microbatches.
    """
    from pipelab.models import digits_data
    from pipelab.models.demo import batches

    x, y = digits_data("train", seed=seed)
    if limit:
        x, y = x[:limit], y[:limit]
    out = batches((x, y), batch_size, seed=seed * 1000 + epoch)
    return [(a, b) for a, b in out if len(a) == batch_size]


def digits_accuracy(net: nn.Module, *, seed: int = 0) -> float:
    """Accuracy of ``net`` on the digits test split."""
    import torch

    from pipelab.models import digits_data

    x, y = digits_data("test", seed=seed)
    net.eval()
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def stash_plan(method: str, stages: int, num_layers: int) -> Plan:
    """The plan a weight-stashing run uses: ``stages`` replicas of the whole model for ``dp``, else
    ``stages`` contiguous stages of near-equal layer counts."""
    from pipelab.partition.plan import Plan

    if method == "dp":
        return Plan.from_boundaries(num_layers, [], replicas=[stages], method="dp")
    return Plan.even(num_layers, stages, method=method)


def stash_experiment(methods: Sequence[str], *, stages: int = 4, epochs: int = 8, batch_size: int = 32,
                     lr: float = 0.1, momentum: float = 0.0, channels: int = 16, train_limit: int = 0,
                     backend: str = "local", seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """Train the digits CNN with each method for ``epochs`` epochs; test accuracy after every epoch.

    Each epoch is one ``pl.train`` call that starts from the previous epoch's final weights (so the
    pipeline fills and drains once per epoch, and optimizer state restarts: use ``momentum=0`` to
    make that irrelevant). Rows: method, epoch, test_accuracy, train_loss (mean over the epoch).
    Methods the runtime cannot run (``pipelab.runtime.supported_methods()``) are left out, and said so.
    """
    import pandas as pd
    import torch
    from tqdm.auto import tqdm

    import pipelab as pl
    from pipelab.profile.fxgraph import layer_nodes, trace
    from pipelab.runtime import supported_methods

    missing = [m for m in methods if parse_method(m)[0] not in supported_methods()]
    if missing:
        print(f"not run: {', '.join(missing)} (the runtime supports {', '.join(supported_methods())})")
        methods = [m for m in methods if m not in missing]
    num_layers = len(layer_nodes(trace(digits_model(channels))))
    rows = []
    bar = tqdm(total=len(methods) * epochs, desc="weight stashing", disable=not progress)
    with tempfile.TemporaryDirectory() as tmp:
        for spec in methods:
            name, opts = parse_method(spec)
            plan = stash_plan(name, stages, num_layers)
            state: str | None = None
            micro = stages if name in ("dp", "gpipe", "1f1b-flush", "2bw", "buffered") else 1
            for epoch in range(epochs):
                data = functools.partial(digits_epoch, epoch, batch_size=batch_size, seed=seed, limit=train_limit)
                steps = len(data())
                run = pl.train(functools.partial(digits_model, channels, state), plan, method=name, data=data,
                               loss_fn=cross_entropy,
                               optimizer=functools.partial(torch.optim.SGD, lr=lr, momentum=momentum),
                               steps=steps, microbatches=micro, backend=backend, seed=seed, progress=False, **opts)
                state = str(Path(tmp) / f"{spec}-{epoch}.pt")
                torch.save(run.state_dict(), state)
                net = digits_model(channels, state)
                losses = [float(v) for v in run.losses]
                rows.append({"method": spec, "epoch": epoch + 1, "test_accuracy": round(digits_accuracy(net, seed=seed), 4),
                             "train_loss": round(sum(losses) / max(len(losses), 1), 4)})
                bar.update()
    bar.close()
    return pd.DataFrame(rows)


def stash_lr_sweep(methods: Sequence[str], lrs: Sequence[float], *, last: int = 3, **kw: Any) -> pd.DataFrame:
    """Late accuracy (mean of the last ``last`` epochs) of each method at each learning rate: one row
    per learning rate, one column per method. ``kw`` goes to :func:`stash_experiment`."""
    import pandas as pd

    rows: list[dict[str, Any]] = []
    for lr in lrs:
        curves = stash_experiment(methods, lr=lr, **kw)
        late = stash_summary(curves, last=last).set_index("method")["late_accuracy"]
        rows.append({"lr": lr, **{m: float(late[m]) for m in late.index}})
    return pd.DataFrame(rows, columns=["lr", *methods]) if not rows else pd.DataFrame(rows)


def stash_summary(curves: pd.DataFrame, *, last: int = 3) -> pd.DataFrame:
    """Per method: final, best and late accuracy (mean of the last ``last`` epochs) and the late gap to
    ``dp`` in percentage points."""
    import pandas as pd

    order = list(dict.fromkeys(curves["method"]))
    g = curves.sort_values("epoch").groupby("method")
    acc_late = g["test_accuracy"].apply(lambda s: s.tail(last).mean()).round(4)
    out = pd.DataFrame({
        "final_accuracy": g["test_accuracy"].last(),
        "best_accuracy": g["test_accuracy"].max(),
        "late_accuracy": acc_late,
        "final_train_loss": g["train_loss"].last(),
    }).loc[order]
    if "dp" in out.index:
        base = float(acc_late["dp"])
        out["late_gap_to_dp_pts"] = ((out["late_accuracy"] - base) * 100).round(2)
    return out.reset_index()


def stash_verdict(summary: pd.DataFrame, *, tolerance_pts: float = 1.0) -> str:
    """The claims, checked against a summary (late accuracy, ``tolerance_pts`` of slack): which hold here."""
    acc = dict(zip(summary["method"], summary["late_accuracy"]))
    if "dp" not in acc:
        return "no dp run: nothing to compare against"
    lines = []
    dp = acc["dp"]

    def gap(m: str) -> float:
        return (acc[m] - dp) * 100

    for m in acc:
        if m == "dp":
            continue
        g = gap(m)
        lines.append(f"{m:26s} {acc[m]:.4f}  {g:+6.2f} pts vs dp -> "
                     + ("reaches dp accuracy" if g >= -tolerance_pts else "below dp accuracy"))
    if "naive-async" in acc and "pipedream" in acc:
        holds = gap("naive-async") < -tolerance_pts and gap("pipedream") >= -tolerance_pts
        lines.append("claim 'weight stashing reaches dp accuracy, naive pipelining does not': "
                     + ("HOLDS here" if holds else "does NOT hold here"))
    if "pipemare" in acc and "naive-async" in acc:
        holds = gap("pipemare") >= -tolerance_pts and gap("pipemare") > gap("naive-async")
        lines.append("claim 'PipeMare closes the gap without stashing': " + ("HOLDS here" if holds else "does NOT hold here"))
    return "\n".join(lines)


# =========================================================================== HetPipe


def rebatch(profile: Profile, batch_size: int) -> Profile:
    """``profile`` at another minibatch size: times and activation bytes scaled linearly, weights kept.

    Linear scaling is an approximation (a GPU is less efficient on small batches); it is what the
    HetPipe reproduction needs to run PipeDream's batch-128 VGG-16 profile at HetPipe's batch 32.
    """
    from dataclasses import replace

    from pipelab.profile.records import Profile as _Profile

    f = batch_size / profile.batch_size
    layers = tuple(replace(layer, fwd_s=layer.fwd_s * f, bwd_s=layer.bwd_s * f, out_bytes=int(layer.out_bytes * f),
                           saved_bytes=int(layer.saved_bytes * f), flops=int(layer.flops * f))
                   for layer in profile.layers)
    return _Profile(layers=layers, cut_bytes=tuple(int(c * f) for c in profile.cut_bytes), batch_size=batch_size,
                    dtype=profile.dtype, device=profile.device, input_bytes=int(profile.input_bytes * f),
                    model=profile.model, source=f"{profile.source} (rebatched {profile.batch_size}->{batch_size})",
                    edges=profile.edges)


def wsp_makespan(wave_s: Sequence[float], *, waves: int, staleness: int, push_s: float = 0.0,
                 pull_s: float = 0.0) -> list[list[float]]:
    """When each virtual worker finishes each wave under Wave Synchronous Parallel (HetPipe ATC'20 §4).

    VW ``v`` computes a wave in ``wave_s[v]`` seconds, then pushes its update (``push_s``, in the
    background). It may go on to wave ``k + 1`` at once while its local clock stays within ``D`` of
    the global clock (the slowest VW's count of pushed waves), i.e. once every VW has pushed wave
    ``k - D``; otherwise it waits for that and then pulls the global weights (``pull_s``) before
    starting. ``D = 0`` is bulk-synchronous at wave granularity: every wave waits for every push and
    a pull. Returns ``end[v][k]``, the time VW ``v`` finishes wave ``k``.
    """
    if staleness < 0:
        raise ValueError(f"staleness bound D={staleness} must be >= 0")
    if waves < 1 or not wave_s or min(wave_s) <= 0:
        raise ValueError("wsp_makespan needs waves >= 1 and positive seconds per wave for every VW")
    V = len(wave_s)
    end = [[0.0] * waves for _ in range(V)]
    for k in range(waves):
        j = k - 1 - staleness          # every VW must have pushed wave j before anyone starts wave k
        gate = max(end[u][j] + push_s for u in range(V)) if j >= 0 else 0.0
        for v in range(V):
            ready = end[v][k - 1] if k else 0.0
            start = ready if gate <= ready else gate + pull_s
            end[v][k] = start + wave_s[v]
    return end


def _vw_minibatch_s(sim: Any, num_vws: int) -> list[float]:
    """Steady-state seconds per minibatch of each virtual worker in a simulated HetPipe trace.

    Minibatch ``m`` belongs to VW ``m % V`` (``pipelab.schedules.hetpipe``); it is done when its last
    backward ends; the rate is taken over the second half of each VW's minibatches (pipeline full).
    """
    done: dict[int, dict[int, float]] = {}
    for e in sim.trace.compute_events():
        if e.kind == "B":
            d = done.setdefault(e.microbatch % num_vws, {})
            d[e.microbatch] = max(d.get(e.microbatch, 0.0), e.end_s)
    out = []
    for v in range(num_vws):
        ends = sorted(done[v].values())
        half = ends[len(ends) // 2:]
        out.append((half[-1] - half[0]) / max(len(half) - 1, 1))
    return out


def hetpipe_simulated(profile_name: str, cluster: str, *, staleness: Sequence[int] = (0, 1, 2, 4),
                      minibatches: int = 48, batch_size: int = 32, policies: Sequence[str] = ("ED", "NP"),
                      waves: int = 50) -> pd.DataFrame:
    """Simulated samples/s of data parallelism and of HetPipe per VW policy and staleness bound ``D``.

    The pipelines inside the virtual workers are simulated by ``pl.simulate`` (method ``hetpipe``);
    the wave synchronisation across them by :func:`wsp_makespan`, with each VW's seconds per wave
    taken from that simulation; a push and a pull each move the largest stage's weights over the
    cluster's outermost link (the parameter server sharded by stage, HetPipe §5).
    """
    import pandas as pd

    import pipelab as pl

    prof = rebatch(pl.models.pipedream_profile(profile_name), batch_size)
    cl = pl.Cluster.preset(cluster)
    dp_plan = pl.partition(prof, cl, method="dp")
    dp = pl.simulate(dp_plan, prof, cl, method="dp", minibatches=max(4, minibatches // 4))
    rows: list[dict[str, Any]] = [{"config": f"dp ({dp_plan.config})", "policy": "", "D": None,
                                   "samples_per_s": dp.throughput, "speedup_over_dp": 1.0, "note": ""}]
    link = cl.levels[-1]
    for policy in policies:
        try:
            het = pl.partition(prof, cl, method="hetpipe", policy=policy)
        except ValueError as exc:   # e.g. a VW of small GPUs cannot hold the model
            rows.append({"config": f"hetpipe {policy}", "policy": policy, "D": None, "samples_per_s": float("nan"),
                         "speedup_over_dp": float("nan"), "note": str(exc).split(";")[0]})
            continue
        vws = het.notes["virtual_workers"]
        # at least 4 minibatches per VW, so that the second half of each VW's run has a rate
        mb = max(minibatches, 4 * len(vws))
        sim = pl.simulate(het, prof, cl, method="hetpipe", minibatches=-(-mb // len(vws)) * len(vws))
        wave = sim.schedule.options.get("wave", het.num_stages)
        per_mb = _vw_minibatch_s(sim, len(vws))
        stage_bytes = max(prof.totals(s.start, s.end).param_bytes for s in het.stages)
        sync = link.latency + stage_bytes / link.bandwidth
        for d in staleness:
            end = wsp_makespan([t * wave for t in per_mb], waves=waves, staleness=d, push_s=sync, pull_s=sync)
            span = max(e[-1] for e in end)
            thr = len(vws) * waves * wave * prof.batch_size / span
            rows.append({"config": f"hetpipe {policy} {het.config} D={d}", "policy": policy, "D": d,
                         "samples_per_s": thr, "speedup_over_dp": thr / dp.throughput,
                         "note": "VW s/minibatch " + ", ".join(f"{t * 1e3:.0f} ms" for t in per_mb)})
    df = pd.DataFrame(rows)
    df["D"] = df["D"].astype("Int64")
    df["samples_per_s"] = df["samples_per_s"].round(2)
    df["speedup_over_dp"] = df["speedup_over_dp"].round(3)
    return df


def hetpipe_emulated(*, stages: int = 2, virtual_workers: int = 2, slowdown: float = 2.0,
                     staleness: Sequence[int] = (0, 1, 2), epochs: int = 3, batch_size: int = 32, lr: float = 0.05,
                     train_limit: int = 0, backend: str = "gloo", seed: int = 0) -> pd.DataFrame:
    """Real processes: DP over ``stages * virtual_workers`` workers vs HetPipe VWs, one worker slowed.

    Rows: config, D, samples_per_s (whole run), test_accuracy after ``epochs`` epochs.
    """
    import pandas as pd
    import torch

    import pipelab as pl
    from pipelab.partition.plan import Plan
    from pipelab.profile.fxgraph import layer_nodes, trace

    n = len(layer_nodes(trace(digits_model())))
    workers = stages * virtual_workers
    slow = {workers - 1: slowdown}
    data = functools.partial(digits_epochs, epochs, batch_size=batch_size, seed=seed, limit=train_limit)
    steps = len(data())
    opt = functools.partial(torch.optim.SGD, lr=lr)
    rows = []
    dp_plan = Plan.from_boundaries(n, [], replicas=[workers], method="dp")
    het_plan = Plan.from_boundaries(n, [round(i * n / stages) for i in range(1, stages)],
                                    replicas=[virtual_workers] * stages, method="hetpipe")
    runs: list[tuple[str, int | None, Plan, dict[str, Any]]] = [("dp", None, dp_plan, {"microbatches": workers})]
    runs += [(f"hetpipe D={d}", d, het_plan, {"D": d}) for d in staleness]
    for name, d, plan, opts in runs:
        method = "dp" if d is None else "hetpipe"
        run = pl.train(digits_model, plan, method=method, data=data, loss_fn=cross_entropy, optimizer=opt,
                       steps=steps, backend=backend, seed=seed, progress=False, slowdown=slow, **opts)
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "w.pt")
            torch.save(run.state_dict(), path)
            acc = digits_accuracy(digits_model(16, path), seed=seed)
        rows.append({"config": name, "D": d, "samples_per_s": round(float(run.throughput), 1),
                     "test_accuracy": round(acc, 4)})
    return pd.DataFrame(rows)


def digits_epochs(epochs: int, *, batch_size: int = 32, seed: int = 0, limit: int = 0) -> list[tuple[Any, Any]]:
    """``epochs`` consecutive epochs of :func:`digits_epoch` as one list (a ``data`` callable)."""
    return [b for e in range(epochs) for b in digits_epoch(e, batch_size=batch_size, seed=seed, limit=limit)]


# =========================================================================== tables and figures


def write_table(df: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write a DataFrame as CSV (atomically)."""
    return atomic_write_text(path, df.to_csv(index=False))


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write a text file (atomically): a result table, an SVG chart."""
    return atomic_write_text(path, text)


def curves_figure(df: pd.DataFrame, *, x: str, y: str, color: str, title: str = "") -> go.Figure:
    """One line per ``color`` value of ``y`` against ``x`` (plotly)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for key, part in df.groupby(color, sort=False):
        fig.add_trace(go.Scatter(x=part[x], y=part[y], mode="lines+markers", name=str(key)))
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template="plotly_white", height=420)
    return fig


def bar_figure(df: pd.DataFrame, *, x: str, y: str, title: str = "") -> go.Figure:
    """Bars of ``y`` per ``x`` (plotly)."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=df[x].astype(str), y=df[y], text=df[y], textposition="outside"))
    fig.update_layout(title=title, yaxis_title=y, template="plotly_white", height=380)
    return fig


_SVG_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf")


def svg_curves(df: pd.DataFrame, *, x: str, y: str, color: str, title: str = "",
               width: int = 640, height: int = 400) -> str:
    """A self-contained SVG line chart (no plotting library, renders anywhere offline)."""
    from html import escape

    left, right, top, bottom = 60, 190, 36, 44
    xs = [float(v) for v in df[x]]
    ys = [float(v) for v in df[y]]
    if not xs:
        raise ValueError("svg_curves needs at least one row")
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    pad = (y1 - y0) * 0.05 or 0.05
    y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + (y1 - v) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for i in range(5):
        v = y0 + (y1 - y0) * i / 4
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    for v in sorted(set(xs)):
        out.append(f'<text x="{px(v):.1f}" y="{top + ph + 16}" text-anchor="middle">{v:g}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">{escape(x)}</text>')
    out.append(f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
               f'text-anchor="middle">{escape(y)}</text>')
    for i, (key, part) in enumerate(df.groupby(color, sort=False)):
        c = _SVG_COLORS[i % len(_SVG_COLORS)]
        pts = " ".join(f"{px(float(a)):.1f},{py(float(b)):.1f}" for a, b in zip(part[x], part[y]))
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>')
        ly = top + 14 + 18 * i
        out.append(f'<line x1="{left + pw + 12}" x2="{left + pw + 32}" y1="{ly - 4}" y2="{ly - 4}" '
                   f'stroke="{c}" stroke-width="3"/><text x="{left + pw + 38}" y="{ly}">{escape(str(key))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# =========================================================================== quickstart


def quickstart(*, image_size: int = 64, batch: int = 4, repeats: int = 3, device: str = "cpu",
               progress: bool = True) -> int:
    """Profile VGG-16 (no weights needed) and print its table and PipeDream's; returns 0."""
    from pipelab.models import example, pipedream_profile
    from pipelab.profile.cli import show
    from pipelab.profile.measure import profile

    model, sample = example("vgg16", batch, image_size=image_size)
    prof = profile(model, sample, device=device, repeats=repeats, progress=progress, model_name="vgg16")
    print(f"== VGG-16 measured here: batch {batch}, {image_size}x{image_size} images, {device} ==")
    show(prof)
    ref = pipedream_profile("vgg16")
    print(f"\n== PipeDream's VGG-16 profile (shipped; batch {ref.batch_size}, 224x224, V100) ==")
    print(repr(ref))
    here = prof.totals(0, len(prof))
    print(f"\nbackward/forward time ratio: here {here.bwd_s / here.fwd_s:.2f}, "
          f"PipeDream {ref.bwd_s / ref.fwd_s:.2f}; parameters {prof.param_bytes / 4:,.0f} (expected 138,357,544)")
    return 0


# =========================================================================== the driver


@dataclass(frozen=True)
class Job:
    """One papermill run: a notebook, its parameters, and where its results go."""

    name: str
    notebook: Path
    parameters: dict[str, Any]
    out_dir: Path


def run_notebook(notebook: Path, executed: Path, parameters: Mapping[str, Any], *, cwd: Path,
                 timeout: int = 900) -> Path:
    """Execute ``notebook`` with papermill (``parameters`` injected after its ``parameters`` cell).

    Raises ``RuntimeError`` naming the notebook, the failing cell's error and the executed copy to open.
    """
    import papermill as pm

    executed.parent.mkdir(parents=True, exist_ok=True)
    env_before = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        pm.execute_notebook(str(notebook), str(executed), parameters=dict(parameters), cwd=str(cwd),
                            kernel_name="python3", progress_bar=False, log_output=False,
                            execution_timeout=timeout)
    except pm.PapermillExecutionError as exc:
        raise RuntimeError(f"{notebook.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}\n"
                           f"open {executed} to see the traceback") from None
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    return executed


def table1_jobs(out_dir: Path, *, rows: Sequence[PaperRow] = TABLE1, minibatches: int = 64,
                extra: Mapping[str, Any] | None = None) -> list[Job]:
    """One simulate-mode job per Table 1 row."""
    nb = REPRODUCTIONS / "pipedream_table1" / "table1.ipynb"
    jobs = []
    for r in rows:
        params = {"model": r.model, "cluster": r.cluster, "servers": r.servers, "gpus_per_server": r.gpus_per_server,
                  "mode": "simulate", "minibatches": minibatches, "report": True, **(extra or {})}
        jobs.append(Job(r.key, nb, params, out_dir / "_runs" / r.key.replace("/", "_")))
    return jobs


def table1_markdown(df: pd.DataFrame) -> str:
    """The paper-vs-ours table as markdown."""
    cols = {"model": "model", "cluster": "cluster", "servers_x_gpus": "servers×GPUs",
            "paper_config": "paper config", "config": "ours", "config_no_memory_limit": "ours, no mem. limit",
            "paper_speedup": "paper ×", "predicted_speedup": "predicted ×", "simulated_speedup": "simulated ×",
            "simulated_speedup_no_memory_limit": "sim. × no mem. limit", "error": "error",
            "dp_exposed_comm_share": "DP exposed comm (ours)", "paper_implied_dp_comm_share": "DP comm implied by paper",
            "shape_matches": "shape ok", "within_25pct": "within 25%"}
    show = df[[c for c in cols if c in df.columns]].rename(columns=cols).copy()
    if "error" in show:
        show["error"] = [f"{v:+.0%}" if isinstance(v, (int, float)) and not math.isnan(v) else "" for v in show["error"]]
    return markdown_table(show)


def markdown_table(df: pd.DataFrame) -> str:
    """A pipe table without the optional ``tabulate`` dependency."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:g}"
        return "" if v is None else str(v)

    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def table1_results_md(folder: Path) -> str:
    """``results.md`` of the Table 1 folder from its ``results.csv`` and ``measure.csv`` (either may be missing)."""
    import pandas as pd

    md = ""
    if (folder / "results.csv").exists():
        table = pd.read_csv(folder / "results.csv")
        md += ("# PipeDream Table 1: paper vs pipelab (simulated)\n\n"
               "Speed-up over data parallelism on the same cluster; *predicted* by the partitioner, *simulated* "
               "by `pl.simulate` (the number compared with the paper). See README.md for why they differ.\n\n"
               + table1_markdown(table) + "\n")
    if (folder / "measure.csv").exists():
        m = pd.read_csv(folder / "measure.csv").iloc[0]
        md += ("\n## Measure mode: real processes on this machine (reduced model)\n\n"
               + markdown_table(pd.DataFrame({"": list(m.index), "value": list(m.values)})) + "\n")
    return md


def build_report(sections: Sequence[tuple[str, Path]], intro_md: str, path: Path, *, title: str) -> Path:
    """Merge executed notebooks into one offline HTML report, with plotly.js included once.

    The notebooks ran with ``report=True``, so their figures are HTML that expects a global ``Plotly``;
    the first cell of the merged notebook defines it. Code is hidden; outputs are kept.
    """
    import nbformat
    from nbconvert import HTMLExporter
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
    from plotly.offline import get_plotlyjs

    # plotly.js registers itself as an AMD module when require.js is present, and then ``window.Plotly``
    # stays undefined: hide ``define`` while it loads.
    js = ("<script>var __pl_define = window.define; window.define = undefined;</script>\n"
          f"<script type=\"text/javascript\">{get_plotlyjs()}</script>\n"
          "<script>window.define = __pl_define;</script>")
    lib = new_code_cell("")
    lib.outputs = [new_output("display_data", data={"text/html": js})]
    cells = [new_markdown_cell(intro_md), lib]
    for heading, executed in sections:
        cells.append(new_markdown_cell(f"## {heading}"))
        run = nbformat.read(str(executed), as_version=4)
        for c in run.cells:
            tags = c.get("metadata", {}).get("tags", [])
            if c.cell_type == "code" and "parameters" not in tags and "injected-parameters" not in tags and c.outputs:
                cells.append(c)
    for i, c in enumerate(cells):  # cells come from several notebooks: make their ids unique again
        c.id = f"report-{i}"
    nb = new_notebook(cells=cells)
    nb.metadata["title"] = title
    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    exporter.require_js_url = "data:application/javascript,"  # nothing to fetch: the report works offline
    body, _ = exporter.from_notebook_node(nb)
    return atomic_write_text(path, body)


def run_jobs(jobs: Sequence[Job], *, bar: Any, tmp: Path) -> list[tuple[Job, Path]]:
    """Run jobs in order, advancing ``bar``; returns each job with its executed notebook."""
    done = []
    for job in jobs:
        bar.set_postfix_str(job.name)
        job.out_dir.mkdir(parents=True, exist_ok=True)
        executed = tmp / (job.name.replace("/", "_") + ".ipynb")
        run_notebook(job.notebook, executed, {**job.parameters, "out_dir": str(job.out_dir)},
                     cwd=job.notebook.parent)
        done.append((job, executed))
        bar.update()
    return done


def collect_table1(done: Sequence[tuple[Job, Path]]) -> pd.DataFrame:
    """The rows the Table 1 jobs wrote, in job order."""
    import pandas as pd

    return pd.DataFrame([json.loads((job.out_dir / "row.json").read_text()) for job, _ in done])


def main(argv: Sequence[str] | None = None) -> int:
    """``pipelab reproduce``: run every reproduction notebook and print the Table 1 comparison."""
    import shutil

    import pandas as pd
    from tqdm.auto import tqdm

    p = argparse.ArgumentParser(prog="pipelab reproduce", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="table1,measure,weight_stashing,hetpipe,weight_buffer",
                   help="comma-separated parts to run (default: all)")
    p.add_argument("--quick", action="store_true", help="tiny sizes (seconds, for tests); results go to --out")
    p.add_argument("--out", default=None, help="write results here instead of into reproductions/<part>/")
    p.add_argument("--minibatches", type=int, default=64, help="simulated minibatches per Table 1 row")
    p.add_argument("--quickstart", action="store_true",
                   help="only profile VGG-16 on this CPU and print its table beside PipeDream's")
    args = p.parse_args(list(argv) if argv is not None else None)
    if args.quickstart:
        try:
            return quickstart()
        except (ValueError, TypeError) as exc:
            print(f"pipelab reproduce: error: {exc}", file=sys.stderr)
            return 2
    parts = [s.strip() for s in args.only.split(",") if s.strip()]
    known = {"table1", "measure", "weight_stashing", "hetpipe", "weight_buffer"}
    if unknown := set(parts) - known:
        p.error(f"unknown part(s) {sorted(unknown)}; choose from {sorted(known)}")
    if not REPRODUCTIONS.is_dir():
        print(f"pipelab reproduce needs the repository's reproductions/ folder next to the package "
              f"({REPRODUCTIONS} does not exist); run it from a clone with `make reproduce`", file=sys.stderr)
        return 2
    out_root = Path(args.out).resolve() if args.out else None

    def out_of(part: str) -> Path:
        return (out_root / part) if out_root else REPRODUCTIONS / part

    quick = args.quick
    jobs: dict[str, list[Job]] = {}
    t1 = out_of("pipedream_table1")
    if "table1" in parts:
        rows = TABLE1[:2] if quick else TABLE1
        jobs["table1"] = table1_jobs(t1, rows=rows, minibatches=12 if quick else args.minibatches,
                                     extra={"gantt_minibatches": 3} if quick else None)
    if "measure" in parts:
        mparams = {"model": "vgg16", "cluster": "pipedream-a", "servers": 4, "gpus_per_server": 4, "mode": "measure",
                   "measure_workers": 2, "report": True, "minibatches": 16}
        if quick:
            mparams.update(measure_steps=3, measure_warmup=1, measure_batch=8, measure_width=0.0625, minibatches=8,
                           gantt_minibatches=2)
        jobs["measure"] = [Job("table1 measure mode", REPRODUCTIONS / "pipedream_table1" / "table1.ipynb", mparams,
                               t1 / "_runs" / "measure")]
    if "weight_stashing" in parts:
        sparams: dict[str, Any] = {"report": True}
        if quick:
            sparams.update(methods=["dp", "pipedream"], epochs=1, train_limit=128)
        jobs["weight_stashing"] = [Job("weight stashing", REPRODUCTIONS / "weight_stashing" / "weight_stashing.ipynb",
                                       sparams, out_of("weight_stashing"))]
    if "hetpipe" in parts:
        hparams: dict[str, Any] = {"report": True}
        if quick:
            hparams.update(staleness=[0, 1], minibatches=12, emu_epochs=1, emu_train_limit=128)
        jobs["hetpipe"] = [Job("hetpipe", REPRODUCTIONS / "hetpipe" / "hetpipe.ipynb", hparams, out_of("hetpipe"))]
    buffer_nb = REPRODUCTIONS / "weight_buffer" / "weight_buffer.ipynb"
    if "weight_buffer" in parts and buffer_nb.exists():
        bparams: dict[str, Any] = {"report": True}
        if quick:
            bparams.update(quick=True)
        jobs["weight_buffer"] = [Job("weight buffer", buffer_nb, bparams, out_of("weight_buffer"))]

    total = sum(len(v) for v in jobs.values())
    failures: list[str] = []
    done: dict[str, list[tuple[Job, Path]]] = {}
    with tempfile.TemporaryDirectory() as tmpdir, tqdm(total=total, desc="reproduce", unit="notebook") as bar:
        tmp = Path(tmpdir)
        for part, js in jobs.items():
            try:
                done[part] = run_jobs(js, bar=bar, tmp=tmp)
            except RuntimeError as exc:
                failures.append(f"{part}: {exc}")
                bar.update(len(js) - len(done.get(part, [])))
        table = collect_table1(done["table1"]) if "table1" in done else None
        measure = None
        if "measure" in done:
            mrow = json.loads((done["measure"][0][0].out_dir / "row.json").read_text())
            measure = pd.DataFrame([{k[len("measure_"):]: v for k, v in mrow.items() if k.startswith("measure_")}])
        if table is not None:
            write_table(table, t1 / "results.csv")
        if measure is not None:
            write_table(measure, t1 / "measure.csv")
        md = table1_results_md(t1)   # from the files, so that a partial run keeps the other part
        if md:
            atomic_write_text(t1 / "results.md", md)
        if table is not None:
            sections = [(job.name, ex) for job, ex in done["table1"]] + [(job.name, ex) for job, ex in done.get("measure", [])]
            build_report(sections, md, t1 / "report.html", title="PipeDream Table 1 with pipelab")
        for part in ("table1", "measure"):
            for job, _ in done.get(part, []):
                shutil.rmtree(job.out_dir, ignore_errors=True)
        if (t1 / "_runs").is_dir() and not any((t1 / "_runs").iterdir()):
            (t1 / "_runs").rmdir()
    if (t1 / "results.md").exists() and ("table1" in done or "measure" in done):
        print("\nPipeDream Table 1 (Narayanan et al., SOSP'19) vs pipelab:\n")
        print((t1 / "results.md").read_text())
        print(f"written under {t1}: results.csv, measure.csv, results.md, report.html")
    for f in failures:
        print("FAILED", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""HetPipe (Park et al., USENIX ATC'20): virtual workers of mixed GPUs under Wave Synchronous Parallel.

The pipelines inside the virtual workers come from the simulator; the wave synchronisation across them
from :func:`wsp_makespan`; the emulated part runs the runtime with per-worker slowdowns.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


from pipelab.cluster import HETPIPE_DEVICES, Cluster
from pipelab.graph import layer_nodes, trace
from pipelab.models import pipedream_profile
from pipelab.partition import partition
from pipelab.partition.plan import Plan
from pipelab.profile.records import Profile
from pipelab.profile.records import Profile as _Profile
from pipelab.runtime.launch import train
from pipelab.runtime.param_server import check_trace
from pipelab.sim.simulate import simulate
from reproductions.pipedream_table1.measure import cross_entropy
from reproductions.weight_stashing.stashing import digits_accuracy, digits_epochs, digits_model


def rebatch(profile: Profile, batch_size: int) -> Profile:
    """``profile`` at another minibatch size: times and activation bytes scaled linearly, weights kept.

    Linear scaling is an approximation (a GPU is less efficient on small batches); it is what the
    HetPipe reproduction needs to run PipeDream's batch-128 VGG-16 profile at HetPipe's batch 32.
    """
    from dataclasses import replace


    f = batch_size / profile.batch_size
    layers = tuple(
        replace(
            layer,
            fwd_s=layer.fwd_s * f,
            bwd_s=layer.bwd_s * f,
            fwd_fixed_s=layer.fwd_fixed_s * f,
            bwd_fixed_s=layer.bwd_fixed_s * f,
            wgrad_s=None if layer.wgrad_s is None else layer.wgrad_s * f,
            out_bytes=int(layer.out_bytes * f),
            saved_bytes=int(layer.saved_bytes * f),
            flops=int(layer.flops * f),
        )
        for layer in profile.layers
    )
    return _Profile(
        layers=layers,
        cut_bytes=tuple(int(c * f) for c in profile.cut_bytes),
        batch_size=batch_size,
        dtype=profile.dtype,
        device=profile.device,
        input_bytes=int(profile.input_bytes * f),
        model=profile.model,
        source=f"{profile.source} (rebatched {profile.batch_size}->{batch_size})",
        edges=profile.edges,
        loss_saved_bytes=int(profile.loss_saved_bytes * f),
    )


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


def dp_cluster(prof: Profile, cluster: Cluster) -> tuple[Cluster, str]:
    """The devices data parallelism can use: all of ``cluster``, or, when a replica does not fit on its
    smallest GPUs, HetPipe's cluster without the node types of least memory (Horovod cannot train on a
    GPU that cannot hold the model). Returns the cluster and a note saying what was left out."""
    try:
        partition(prof, cluster, method="dp")
        return cluster, ""
    except ValueError as exc:
        if not cluster.name.startswith("hetpipe"):
            raise
        first = str(exc).split(";")[0]
    by_memory = sorted(HETPIPE_DEVICES, key=lambda t: HETPIPE_DEVICES[t].memory_bytes, reverse=True)
    for keep in range(len(by_memory) - 1, 0, -1):
        types = "".join(t for t in "VRGQ" if t in by_memory[:keep])
        sub = Cluster.hetpipe(servers=len(types), gpus_per_server=cluster.num_workers // 4 or 1, types=types)
        try:
            partition(prof, sub, method="dp")
        except ValueError:
            continue
        gone = ", ".join(HETPIPE_DEVICES[t].name for t in "VRGQ" if t not in types)
        return sub, f"only {sub.num_workers} GPUs: {first} on {gone}"
    raise ValueError(f"data parallelism does not fit on any node type of {cluster.name}: {first}")


def hetpipe_simulated(profile_name: str | Profile, cluster: str, *, staleness: Sequence[int] = (0, 1, 2, 4),
                      minibatches: int = 48, batch_size: int = 32, policies: Sequence[str] = ("ED", "NP"),
                      waves: int = 50) -> pd.DataFrame:
    """Simulated samples/s of data parallelism and of HetPipe per VW policy and staleness bound ``D``.

    The pipelines inside the virtual workers are simulated by ``pl.simulate`` (method ``hetpipe``);
    the wave synchronisation across them by :func:`wsp_makespan`, with each VW's seconds per wave
    taken from that simulation; a push and a pull each move the largest stage's weights over the
    cluster's outermost link (the parameter server sharded by stage, HetPipe §5). ``profile_name``: a
    shipped PipeDream profile (rebatched to ``batch_size``) or a :class:`Profile` used as it is.
    """
    import pandas as pd


    prof = (profile_name if isinstance(profile_name, _Profile)
            else rebatch(pipedream_profile(profile_name), batch_size))
    cl = Cluster.preset(cluster)
    dp_cl, dp_note = dp_cluster(prof, cl)
    dp_plan = partition(prof, dp_cl, method="dp")
    dp = simulate(dp_plan, prof, dp_cl, method="dp", minibatches=max(4, minibatches // 4))
    rows: list[dict[str, Any]] = [{"config": f"dp ({dp_plan.config})", "policy": "", "D": None,
                                   "samples_per_s": dp.throughput, "speedup_over_dp": 1.0, "note": dp_note}]
    link = cl.levels[-1]
    for policy in policies:
        try:
            het = partition(prof, cl, method="hetpipe", policy=policy)
        except ValueError as exc:  # e.g. a VW of small GPUs cannot hold the model
            rows.append(
                {
                    "config": f"hetpipe {policy}",
                    "policy": policy,
                    "D": None,
                    "samples_per_s": float("nan"),
                    "speedup_over_dp": float("nan"),
                    "note": str(exc).split(";")[0],
                }
            )
            continue
        vws = het.notes["virtual_workers"]
        # at least 4 minibatches per VW, so that the second half of each VW's run has a rate
        mb = max(minibatches, 4 * len(vws))
        sim = simulate(het, prof, cl, method="hetpipe", minibatches=-(-mb // len(vws)) * len(vws))
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


def hetpipe_emulated(
    *,
    stages: int = 2,
    virtual_workers: int = 2,
    slowdown: float = 2.0,
    staleness: Sequence[int] = (0, 1, 2),
    epochs: int = 3,
    batch_size: int = 32,
    lr: float = 0.05,
    train_limit: int = 0,
    backend: str = "gloo",
    seed: int = 0,
) -> pd.DataFrame:
    """Real processes: DP over ``stages * virtual_workers`` workers vs HetPipe VWs, one worker slowed.

    Rows: config, D, samples_per_s (whole run), final_train_loss (mean of the last tenth of the
    steps), test_accuracy after ``epochs`` epochs, and for HetPipe the largest staleness a pull saw.
    """
    import pandas as pd
    import torch


    n = len(layer_nodes(trace(digits_model())))
    workers = stages * virtual_workers
    slow = {workers - 1: slowdown}
    data = functools.partial(digits_epochs, epochs, batch_size=batch_size, seed=seed, limit=train_limit)
    # every virtual worker must end on a full wave (NOAM = `stages` minibatches): steps a multiple of V * wave
    steps = len(data()) // (virtual_workers * stages) * (virtual_workers * stages)
    opt = functools.partial(torch.optim.SGD, lr=lr)
    rows = []
    dp_plan = Plan.from_boundaries(n, [], replicas=[workers], method="dp")
    het_plan = Plan.from_boundaries(n, [round(i * n / stages) for i in range(1, stages)],
                                    replicas=[virtual_workers] * stages, method="hetpipe")
    runs: list[tuple[str, int | None, Plan, dict[str, Any]]] = [
        ("dp", None, dp_plan, {"microbatches": workers})
    ]
    runs += [(f"hetpipe D={d}", d, het_plan, {"D": d}) for d in staleness]
    for name, d, plan, opts in runs:
        method = "dp" if d is None else "hetpipe"
        run = train(digits_model, plan, method=method, data=data, loss_fn=cross_entropy, optimizer=opt,
                       steps=steps, backend=backend, seed=seed, progress=False, slowdown=slow, **opts)
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "w.pt")
            torch.save(run.state_dict(), path)
            acc = digits_accuracy(digits_model(16, path), seed=seed)
        losses = [float(v) for v in run.losses]
        tail = losses[-max(1, len(losses) // 10):]
        row: dict[str, Any] = {
            "config": name,
            "D": d,
            "samples_per_s": round(float(run.throughput), 1),
            "final_train_loss": round(sum(tail) / len(tail), 4),
            "test_accuracy": round(acc, 4),
        }
        if d is not None:
            # the largest lead of a VW over the global clock at any pull, replayed from the trace (the
            # bound must hold: check_trace raises if a pull broke it)

            try:
                row["max_staleness_seen"] = check_trace(run.trace, d)
            except ValueError:   # this runtime does not record push/pull events in the trace
                row["max_staleness_seen"] = None
        rows.append(row)
    df = pd.DataFrame(rows)
    df["D"] = df["D"].astype("Int64")
    if "max_staleness_seen" in df:
        df["max_staleness_seen"] = df["max_staleness_seen"].astype("Int64")
    return df

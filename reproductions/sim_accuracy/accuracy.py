"""The simulator against real runs, method by method: ``reproductions/sim_accuracy``.

For every method x workers x microbatches x model of the matrix, the same plan and schedule are
simulated on the calibrated cluster of this machine (:func:`pipelab.calibrate.calibrate`) with
the profile measured here, and run for real on gloo processes. Both traces are measured the same
way (:func:`steady_throughput`: the steady-state window of minibatch completions, warm-up and
drain excluded, :mod:`pipelab.metrics`), so the error is the model's, not the metric's.

Everything a worker process imports (model and data builders, loss, optimizer) lives at module level.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

import pipelab.methods as methods
from pipelab.calibrate.model import calibrate_model
from pipelab.cluster import Cluster
from pipelab.measured import HOST_TERMS, HostEffects
from pipelab.models import demo
from pipelab.partition import partition
from pipelab.partition.balance import uniform_cuts
from pipelab.partition.plan import Plan
from pipelab.partition.virtual import virtual_plan
from pipelab.profile.measure import profile as measure_profile
from pipelab.profile.records import Profile
from pipelab.runtime.launch import train
from pipelab.sim.simulate import simulate
from reproductions.sim_accuracy.terms import (
    OPTIMIZER,
    MeasuredActions,
    busy_by_worker,
    replay_throughput,
    steady_throughput,
    steady_window,
)

#: the methods of the matrix, with the options they need to build
METHODS: dict[str, dict[str, Any]] = {
    "dp": {},
    "gpipe": {},
    "1f1b-flush": {},
    "interleaved-1f1b": {"chunks": 2},
    "zb-h1": {},
    "pipedream": {},
    "2bw": {},
    "pipemare": {"warmup_steps": 10},
}


# ---------------------------------------------------------------------- the two models and their data
def cnn() -> nn.Module:
    """The digits CNN of the quickstart."""
    return demo.small_cnn()


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    return demo.digits_data("train")


def cnn_data(batch: int = 64) -> list[tuple[torch.Tensor, ...]]:
    """scikit-learn's digits in minibatches of ``batch`` (whole minibatches only; loaded once per
    process, so that a new epoch does not pay scikit-learn's loading inside the measured window)."""
    x, y = _digits()
    n = len(y) // batch * batch
    return demo.batches((x[:n], y[:n]), batch)


def transformer() -> nn.Module:
    """A transformer-style stack: 4 encoder blocks of width 64 over 16-token sequences."""
    return demo.tiny_transformer(vocab=100, d_model=64, heads=2, depth=4, max_len=16)


def transformer_data(batch: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random token sequences and per-token targets (a copy task), ``batch`` sequences each."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(2, 100, (batch * 24, 16), generator=g)
    return [(x[i : i + batch], x[i : i + batch].flip(1)) for i in range(0, len(x), batch)]


def token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every token."""
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def cross_entropy(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of class logits."""
    return nn.functional.cross_entropy(out, y)


def sgd(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """SGD with momentum (the cost model's ``sgd-momentum``)."""
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


#: model name -> (model_fn, data_fn, loss_fn, batch)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[..., Any], Callable[..., torch.Tensor], int]] = {
    "cnn": (cnn, cnn_data, cross_entropy, 64),
    "transformer": (transformer, transformer_data, token_loss, 32),
}


#: minibatches per run by default: about a second of steady state each on a 2-core CPU (a shorter
#: window is at the mercy of one descheduling of a few milliseconds)
STEPS = {"cnn": 160, "transformer": 48}


# ---------------------------------------------------------------------- the matrix
def configurations(
    *,
    full: bool = False,
    models: Sequence[str] | None = None,
    methods_: Sequence[str] | None = None,
    workers: Sequence[int] | None = None,
    microbatches: Sequence[int] | None = None,
) -> list[tuple[str, str, int, int]]:
    """``(model, method, workers, microbatches)`` of the matrix where the method allows them
    (per-microbatch methods and ``dp`` take M = 1; interleaving needs M a multiple of P).

    ``full``: 2, 3, 4 workers x 1, 2, 4, 8 microbatches x both models; the default: 2 workers,
    M = 4 for the flushed and coalescing methods, both models.
    """
    ms = list(models or MODELS)
    ws = list(workers or ((2, 3, 4) if full else (2,)))
    mbs = list(microbatches or ((1, 2, 4, 8) if full else (4,)))
    out = []
    for model in ms:
        for method in methods_ or METHODS:
            spec = methods.get(method)
            for p in ws:
                # dp splits each minibatch over its replicas: M = workers (one microbatch each)
                own = [p] if spec.partitioner == "dp" else [1] if spec.update == "microbatch" else mbs
                for m in own:
                    if method == "interleaved-1f1b" and m % p:
                        continue
                    out.append((model, method, p, m))
    return out


#: the splits a configuration's plan can take (:func:`plan_for`)
SPLITS = ("balanced", "uniform")


def plan_for(prof: Profile, cluster: Cluster, method: str, workers: int, microbatches: int,
             split: str = "balanced") -> Plan:
    """The plan a method runs on ``workers``: data parallel for ``dp``, else a straight pipeline,
    time-balanced (``split="balanced"``: GPipe's balance) or with as many layers per stage as the
    layer count allows (``"uniform"``: the planner's default split, the one torch or Megatron users
    get); for interleaving the simulator and :func:`run_plan` split it into ``chunks x workers``
    virtual stages (:func:`pipelab.sim.simulate.virtual_plan`)."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: use one of {SPLITS}")
    cl = cluster.with_workers(workers)
    if methods.get(method).partitioner == "dp":
        return partition(prof, cl, method="dp", allreduce_overlap="none")
    if split == "uniform":
        return Plan.from_boundaries(len(prof), uniform_cuts(len(prof), workers), batch_size=prof.batch_size)
    return partition(prof, cl, method="gpipe", stages=workers, microbatches=max(microbatches, 1))


def default_configurations(models: Sequence[str] | None = None,
                           workers: Sequence[int] = (2,)) -> list[tuple[str, str, int, int, str]]:
    """The planner's default per model and worker count, ``(model, "1f1b-flush", P, P, "uniform")``:
    1F1B on a uniform layer split with ``M = P``, the plan every real-run decision of the planner is
    compared with (:attr:`pipelab.planner.PlanTable.default`), so its measured error belongs in the
    margins."""
    return [(m, "1f1b-flush", p, p, "uniform") for m in (models or MODELS) for p in workers]


def run_plan(plan: Plan, prof: Profile, method: str) -> Plan:
    """The plan the runtime executes: ``plan``, or its virtual stages for an interleaved method (the
    split the simulator makes of the same plan)."""
    chunks = METHODS.get(method, {}).get("chunks")
    return virtual_plan(plan, prof, int(chunks)) if chunks else plan


def run_one(
    model: str,
    method: str,
    workers: int,
    microbatches: int,
    *,
    prof: Profile,
    cluster: Cluster,
    steps: int | None = None,
    timeout: float = 180.0,
    memory: bool = True,
    rounds: int = 3,
    split: str = "balanced",
    factor_cluster: Cluster | None = None,
    fresh: Callable[[], Profile] | None = None,
) -> dict[str, Any]:
    """Simulate and run one configuration; a row of the accuracy table (``split``: :func:`plan_for`).

    ``factor_cluster``: ``cluster`` with the model's compute factors measured in runs of its own
    (:func:`model_clusters`); the same plan simulated on it is paired with the same real runs
    (``error_model_factor``; NaN without it). ``fresh`` profiles the model again right before the real
    runs; the same plan simulated on that profile is paired with them too (``error_fresh_profile``:
    what the machine's drift between ``prof`` and these runs adds; NaN without it).

    The real run is repeated ``rounds`` times: the measured rate is the median (a shared CPU's
    rounds differ), and its spread ``(max - min) / median`` is recorded beside it.

    With ``memory``, a second short run (3 minibatches, ``measure_memory=True``, whose counting
    would slow the timed run) measures each worker's peak memory against the simulator's.
    """
    model_fn, data_fn, loss_fn, batch = MODELS[model]
    steps = steps or STEPS[model]
    plan = plan_for(prof, cluster, method, workers, microbatches, split)
    opts = _sim_options(method)
    run_opts = dict(METHODS[method])
    cl = cluster.with_workers(workers)
    def simulated(minibatches: int, on: Cluster = cl, host: HostEffects | bool = True) -> Any:
        return _simulated(plan, prof, on, method, microbatches, minibatches, host)

    def measured(minibatches: int, **more: Any) -> Any:
        return train(model_fn, run_plan(plan, prof, method), method=method,
                     data=functools.partial(data_fn, batch), loss_fn=loss_fn, optimizer=sgd,
                     steps=minibatches, microbatches=microbatches, backend="gloo", progress=False,
                     timeout=timeout, **more)

    sim = simulated(steps)
    cal = cl.calibration

    def rate(res: Any) -> float:
        return steady_throughput(res.trace, res.schedule, batch)

    def without(**fields: Any) -> float:
        """Samples/s of the same simulation with those calibration fields replaced: one term's
        effect, paired with the same real runs."""
        assert cal is not None
        return rate(simulated(steps, dataclasses.replace(cl, calibration=dataclasses.replace(cal, **fields))))

    host = cal.host_effects if cal is not None else HostEffects()
    sim_tp = rate(sim)
    # each host term left out (HostEffects.without), and all of them: the core model alone
    host_tp = {t: rate(simulated(steps, host=host.without(t))) if t in host.terms else sim_tp
               for t in HOST_TERMS}
    core_tp = rate(simulated(steps, host=False)) if host.terms else sim_tp
    # with the all-reduce's one latency, whatever the compute before it (the term before allreduce_after)
    flat_ar_tp = without(allreduce_after=()) if cal is not None and cal.allreduce_after else sim_tp
    # the same plan with the model's own compute factors (measured in runs of its own), paired
    fac_tp = math.nan
    if factor_cluster is not None:
        fac = simulated(steps, factor_cluster.with_workers(workers))
        fac_tp = steady_throughput(fac.trace, fac.schedule, batch)
    fresh_tp = math.nan
    if fresh is not None:
        now = _simulated(plan, fresh(), cl, method, microbatches, steps)
        fresh_tp = steady_throughput(now.trace, now.schedule, batch)
    t0 = time.perf_counter()
    runs = [measured(steps, **run_opts) for _ in range(rounds)]
    wall = time.perf_counter() - t0
    rates = [steady_throughput(r.trace, r.schedule, batch) for r in runs]
    run = runs[rates.index(statistics.median_low(rates))]  # the median round (its busy times too)
    got, want = run.trace.actions_by_worker(), sim.trace.actions_by_worker()
    if got != want:
        diff = {
            w: next(
                ((i, x, y) for i, (x, y) in enumerate(zip(got.get(w, []), want.get(w, []))) if x != y),
                (len(got.get(w, [])), len(want.get(w, []))),
            )
            for w in set(got) | set(want)
            if got.get(w) != want.get(w)
        }
        raise AssertionError(
            f"{model} {method}: the runtime and the simulator ran different schedules: {diff}"
        )
    replay_tp = replay_throughput(run, sim, plan, _as_simulated(prof, method, microbatches), cl, batch)
    real_tp = statistics.median(rates)
    sb, rb = busy_by_worker(sim.trace, sim.schedule), busy_by_worker(run.trace, run.schedule)
    busy_err = {w: (sb[w] - rb[w]) / rb[w] for w in rb if rb[w] > 0}
    mem_err: dict[int, float] = {}
    if memory:
        short = simulated(3)
        res = measured(3, schedule=short.schedule, measure_memory=True,
                       **{k: v for k, v in run_opts.items() if k not in opts})
        mem_err = {w: (short.peak_memory[w] - m) / m for w, m in res.peak_state.items() if m > 0}
    return {
        "model": model,
        "method": method,
        "workers": workers,
        "microbatches": microbatches,
        "config": plan.config,
        "split": "dp" if methods.get(method).partitioner == "dp" else split,
        "steps": steps,
        "simulated": sim_tp,
        "measured": real_tp,
        "error": (sim_tp - real_tp) / real_tp,
        **{f"error_without_{t}": (host_tp[t] - real_tp) / real_tp for t in HOST_TERMS},
        "error_core": (core_tp - real_tp) / real_tp,
        "error_one_allreduce_latency": (flat_ar_tp - real_tp) / real_tp,
        "error_model_factor": (fac_tp - real_tp) / real_tp,
        "error_fresh_profile": (fresh_tp - real_tp) / real_tp,
        # the same schedule with the real run's action durations: what messages and waiting leave
        "replay_error": (replay_tp - real_tp) / real_tp,
        "rounds": rounds,
        "measured_spread": (max(rates) - min(rates)) / real_tp,
        "busy_error_max": max(busy_err.values(), key=abs) if busy_err else math.nan,
        "busy_error_median": statistics.median(busy_err.values()) if busy_err else math.nan,
        "sim_peak_mib": max(sim.peak_memory) / 2**20,
        "memory_error_max": max(mem_err.values(), key=abs) if mem_err else math.nan,
        "wall_s": wall,
    }


def _as_simulated(prof: Profile, method: str, microbatches: int) -> Profile:
    """The profile the simulator runs a configuration on: for ``dp``, each of its microbatches is one
    profile minibatch on one replica."""
    if methods.get(method).partitioner == "dp":
        return prof.at_batch_size(prof.batch_size // microbatches)
    return prof


def _sim_options(method: str) -> dict[str, Any]:
    """The method's options the simulator takes (:data:`METHODS`, less the runtime's own)."""
    return {k: v for k, v in METHODS[method].items() if k != "warmup_steps"}


def _simulated(plan: Plan, prof: Profile, cluster: Cluster, method: str, microbatches: int,
               minibatches: int, host_effects: HostEffects | bool = True) -> Any:
    """The simulation of a configuration's ``plan`` on ``cluster`` (already of the plan's worker
    count), as :func:`run_one` compares it with the runtime (``host_effects``: as
    :func:`pipelab.sim.simulate`; by default the calibration's record where it has one)."""
    if host_effects is True and cluster.calibration is None:
        host_effects = False
    return simulate(plan, _as_simulated(prof, method, microbatches), cluster, method,
                    microbatches=microbatches, minibatches=minibatches, allreduce_overlap="none",
                    optimizer=OPTIMIZER, host_effects=host_effects, **_sim_options(method))


def predicted_on(model: str, method: str, workers: int, microbatches: int, *, prof: Profile,
                 plan_cluster: Cluster, cluster: Cluster, steps: int | None = None,
                 split: str = "balanced", sim_prof: Profile | None = None) -> float:
    """Samples/s the simulator predicts on ``cluster`` for the configuration :func:`run_one` ran with
    ``plan_cluster`` and ``prof`` (the same plan, made on that cluster from that profile): one
    configuration under another calibration of the same machine, and with ``sim_prof``, under
    another profile of the same model as well."""
    plan = plan_for(prof, plan_cluster, method, workers, microbatches, split)
    sim = _simulated(plan, sim_prof if sim_prof is not None else prof, cluster.with_workers(workers), method,
                     microbatches, steps or STEPS[model])
    return steady_throughput(sim.trace, sim.schedule, MODELS[model][3])


def profiles(models: Sequence[str]) -> dict[str, Profile]:
    """Each model's profile, measured on this machine (``small_batch`` at a quarter of the batch), with
    the loss the runs compute on the last stage (its time and what it saves for its backward)."""
    out = {}
    for name in models:
        model_fn, data_fn, loss_fn, batch = MODELS[name]
        x, y = data_fn(batch)[0]
        out[name] = measure_profile(model_fn(), x, loss_fn=loss_fn, target=y, progress=False, repeats=5,
                                    model_name=name)
    return out


def model_clusters(cluster: Cluster, profs: dict[str, Profile], *, repeats: int = 3) -> dict[str, Cluster]:
    """Per model, ``cluster`` with that model's compute factors measured in runs of its own
    (:func:`pipelab.calibrate.model.calibrate_model`: a two-worker ``1f1b-flush`` run of the model,
    separate from the matrix's runs)."""
    out = {}
    for name, prof in profs.items():
        model_fn, data_fn, loss_fn, batch = MODELS[name]
        out[name] = calibrate_model(cluster, model_fn, functools.partial(data_fn, batch), loss_fn, prof,
                                    optimizer=sgd, repeats=repeats)
    return out


# ---------------------------------------------------------------------- summaries and the figure
def shift_of(df: Any) -> float:
    """The run's common shift: the median signed throughput error over its configurations. Every
    configuration of one run is predicted from the same calibration and profiles, and runs on the
    same machine minutes later, so what the machine's speed did in between moves them together
    (today's runs: -6% to +14%), while a term the model lacks moves the configurations it concerns."""
    return float(df["error"].median())


def less_shift(df: Any) -> Any:
    """Each configuration's error relative to the run's common shift (:func:`shift_of`):
    ``(1 + error) / (1 + shift) - 1``, what is left once the run's predictions are rescaled as one
    (:func:`pipelab.planner.decide.less_shift`, whose ranges the planner decides with)."""
    from pipelab.planner.decide import less_shift as relative

    return relative(df["error"])


def method_table(df: Any) -> Any:
    """Per method (and ``ALL``): runs, median and worst |throughput error| (and where the worst
    was), median |busy-time error|, the median |error| the same runs give without each host effect
    and with the core model alone, with the models' own compute factors and on a profile taken right
    before the runs, the median and worst under a second calibration (where the table has them),
    median and worst |error| less the run's common shift (:func:`less_shift`), worst |peak-memory
    error|."""
    import pandas as pd

    rel = less_shift(df).abs()

    def row(name: str, part: Any) -> dict[str, Any]:
        err = part["error"].abs()
        at = part.loc[err.idxmax()]
        mem = part["memory_error_max"].abs() if "memory_error_max" in part else pd.Series(dtype=float)
        return {
            "method": name,
            "runs": len(part),
            "median |error|": float(err.median()),
            "worst |error|": float(err.max()),
            "worst at": f"{at['model']} P={int(at['workers'])} M={int(at['microbatches'])}"
                        + (" uniform" if str(at.get("split", "")) == "uniform" else ""),
            "median |busy error|": float(part["busy_error_median"].abs().median()),
            # each other host effect left out, and the core model alone (pipelab.sim.host_effects)
            **{f"median |error| without {t}": float(part[f"error_without_{t}"].abs().median())
               for t in HOST_TERMS if f"error_without_{t}" in part},
            **({"median |error| core": float(part["error_core"].abs().median()),
                "worst |error| core": float(part["error_core"].abs().max())} if "error_core" in part else {}),
            **({"worst |error| with one all-reduce latency":
                float(part["error_one_allreduce_latency"].abs().max())}
               if "error_one_allreduce_latency" in part else {}),
            **({"median |error| with model factors": float(part["error_model_factor"].abs().median()),
                "worst |error| with model factors": float(part["error_model_factor"].abs().max())}
               if "error_model_factor" in part and part["error_model_factor"].notna().any() else {}),
            **({"median |error| fresh profile": float(part["error_fresh_profile"].abs().median()),
                "worst |error| fresh profile": float(part["error_fresh_profile"].abs().max())}
               if "error_fresh_profile" in part and part["error_fresh_profile"].notna().any() else {}),
            **({"median |error| recalibrated": float(part["error_recalibrated"].abs().median()),
                "worst |error| recalibrated": float(part["error_recalibrated"].abs().max())}
               if "error_recalibrated" in part and part["error_recalibrated"].notna().any() else {}),
            "median |error| less the run's shift": float(rel[part.index].median()),
            "worst |error| less the run's shift": float(rel[part.index].max()),
            "worst |memory error|": float(mem.max()) if mem.notna().any() else math.nan,
        }

    rows = [row(str(m), part) for m, part in df.groupby("method", sort=False)]
    return pd.DataFrame([*rows, row("ALL", df)])


def svg_scatter(df: Any, *, title: str = "", band: float = 0.10, width: int = 560, height: int = 520) -> str:
    """Predicted against measured throughput, log-log, with ``y = x`` and a ``±band`` band; one
    colour per method (a self-contained SVG, no plotting library)."""
    from html import escape

    from reproductions._common.report import _SVG_COLORS

    xs = [float(v) for v in df["measured"]]
    ys = [float(v) for v in df["simulated"]]
    if not xs:
        raise ValueError("svg_scatter needs at least one row")
    lo = math.log10(min(xs + ys) / 1.3)
    hi = math.log10(max(xs + ys) * 1.3)
    left, right, top, bottom = 64, 150, 36, 48
    pw, ph = width - left - right, height - top - bottom

    def px(v: float) -> float:
        return left + (math.log10(v) - lo) / (hi - lo) * pw

    def py(v: float) -> float:
        return top + (hi - math.log10(v)) / (hi - lo) * ph

    a, b = 10**lo, 10**hi
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>',
        f'<polygon fill="#e8f0fe" points="{px(a):.1f},{py(a * (1 + band)):.1f} '
        f"{px(b / (1 + band)):.1f},{py(b):.1f} {px(b):.1f},{py(b):.1f} {px(b):.1f},{py(b * (1 - band)):.1f} "
        f'{px(a):.1f},{py(a * (1 - band)):.1f}"/>',
        f'<line x1="{px(a):.1f}" y1="{py(a):.1f}" x2="{px(b):.1f}" y2="{py(b):.1f}" stroke="#555" '
        'stroke-dasharray="4 3"/>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>',
    ]
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        for m in (1, 2, 5):
            v = m * 10**e
            if a <= v <= b:
                out.append(
                    f'<text x="{px(v):.1f}" y="{top + ph + 16}" text-anchor="middle">{v:g}</text>'
                    f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:g}</text>'
                )
    out.append(f'<text x="{left + pw / 2}" y="{height - 10}" text-anchor="middle">measured samples/s</text>')
    out.append(
        f'<text x="16" y="{top + ph / 2}" transform="rotate(-90 16 {top + ph / 2})" '
        'text-anchor="middle">simulated samples/s</text>'
    )
    for i, (method, part) in enumerate(df.groupby("method", sort=False)):
        c = _SVG_COLORS[i % len(_SVG_COLORS)]
        for _, r in part.iterrows():
            shape = "rect" if r["model"] != "cnn" else "circle"
            x, y = px(float(r["measured"])), py(float(r["simulated"]))
            tip = f"{r['model']} {method} P={r['workers']} M={r['microbatches']}: {float(r['error']):+.1%}"
            if shape == "circle":
                out.append(
                    f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{c}"><title>{escape(tip)}</title>'
                    "</circle>"
                )
            else:
                out.append(
                    f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" fill="{c}">'
                    f"<title>{escape(tip)}</title></rect>"
                )
        ly = top + 14 + 18 * i
        out.append(
            f'<circle cx="{left + pw + 18}" cy="{ly - 4}" r="5" fill="{c}"/>'
            f'<text x="{left + pw + 30}" y="{ly}">{escape(str(method))}</text>'
        )
    n = df["method"].nunique()
    out.append(
        f'<text x="{left + pw + 12}" y="{top + 30 + 18 * n}">circle: cnn</text>'
        f'<text x="{left + pw + 12}" y="{top + 48 + 18 * n}">square: transformer</text>'
        f'<text x="{left + pw + 12}" y="{top + 66 + 18 * n}">band: ±{band:.0%}</text>'
    )
    out.append("</svg>")
    return "\n".join(out) + "\n"


__all__ = [
    "METHODS",
    "MeasuredActions",
    "MODELS",
    "busy_by_worker",
    "configurations",
    "default_configurations",
    "method_table",
    "shift_of",
    "less_shift",
    "model_clusters",
    "plan_for",
    "predicted_on",
    "profiles",
    "replay_throughput",
    "run_one",
    "run_plan",
    "steady_throughput",
    "steady_window",
    "svg_scatter",
]

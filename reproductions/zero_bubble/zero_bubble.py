"""Zero Bubble Pipeline Parallelism (Qi et al., ICLR 2024) as pipelab's development set.

The paper profiles per-stage times (its Table 6: ``T_F``, ``T_B``, ``T_W``, ``T_comm`` per microbatch)
and measures throughput and memory of 1F1B, interleaved 1F1B, ZB-1p and ZB-2p on 8-32 A100s (its
Table 4). This script:

1. **Fits** the GEMM efficiency of the A100 row of ``pipelab/data/devices.csv`` from ``T_W``
   (weight-gradient GEMMs only) and checks ``T_F`` and ``T_B`` with the element-wise shares that
   published kernel timings give (``reproductions/per_operation``).
2. **Predicts Table 4** three ways, each through pipelab's own schedules (``1f1b-flush``,
   ``interleaved-1f1b`` with ``--virtual`` chunks, ``zb-h1`` for ZB-1p, and for ZB-2p the order
   ``pl.schedules.search_order`` finds within the paper's budget of ``2p`` microbatches, counted as the
   paper's scheduler counts them (a ``B`` frees half a microbatch's activations, its ``W`` the rest)):
   ``bubble`` (the closed form of the bubble alone, Table 6's times), ``table6`` (pipelab's schedules
   on Table 6's times and ``T_comm``), ``analytic`` (pipelab.llm alone: per-stage times of the real
   layer split with the embedding and head on the end stages, p2p over the dgx-a100 links, the
   optimizer step), and memory per GPU from ``pipelab.llm.memory``.

Usage: ``python reproductions/zero_bubble/zero_bubble.py [--virtual 2]``; writes ``table.md`` and
``table.csv`` beside this file and prints the fit.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections.abc import Sequence
from pathlib import Path

from pipelab.cluster import Cluster
from pipelab.llm import Parallel, Transformer, memory_per_device
from pipelab.llm.costs import block_costs, stage_costs
from pipelab.llm.devices import DeviceRates
from pipelab.schedules import build
from pipelab.schedules.actions import Action
from pipelab.schedules.dataflow import Costs, run
from pipelab.schedules.search import StageTimes as SearchTimes
from pipelab.schedules.search import search_order

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
#: Megatron-LM's GPT-2 vocabulary padded to a multiple of 128 (the paper's fork; not stated in Table 4)
VOCAB = 50304
SEQ = 1024
#: ZB-2p is not a fixed builder: the Zero Bubble paper's scheduler under a budget of 2p microbatches
ZB_2P = "search-2p"
METHODS = {"1F1B": "1f1b-flush", "1F1B-I": "interleaved-1f1b", "ZB-1p": "zb-h1", "ZB-2p": ZB_2P}


def _mid(text: str) -> float:
    """The midpoint of a Table 6 range such as ``"29.7-29.9"`` (a single figure: itself)."""
    lo, _, hi = text.partition("-")
    return (float(lo) + float(hi or lo)) / 2


def setups() -> dict[str, dict[str, float | int | list[int]]]:
    """The four models of the paper's setup (``data/setup.csv``)."""
    out: dict[str, dict[str, float | int | list[int]]] = {}
    with open(DATA / "setup.csv", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            out[r["model"]] = {"layers": int(r["layers"]), "heads": int(r["heads"]),
                               "hidden": int(r["hidden"]),
                               "gpus": int(r["gpus"]), "microbatch_size": int(r["microbatch_size"]),
                               "m": [int(x) for x in r["m_values"].split(";")]}
    return out


def table6() -> dict[str, dict[str, float]]:
    """Table 6's profiled seconds per microbatch of one (middle) stage: F, B, W and comm."""
    with open(DATA / "table6_profiled.csv", encoding="utf-8") as fh:
        return {r["model"]: {k: _mid(r[f"T_{k}_ms"]) / 1e3 for k in ("F", "B", "W", "comm")}
                for r in csv.DictReader(fh)}


def table4() -> list[dict[str, str]]:
    """Table 4's measured samples per GPU per second and memory (GB) per model, m and method."""
    with open(DATA / "table4_throughput.csv", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def shape(name: str) -> Transformer:
    """The model's shape (GPT, sequence 1024, untied head as Megatron-LM's pipeline keeps two copies)."""
    s = setups()[name]
    return Transformer(name=name, layers=int(s["layers"]), hidden=int(s["hidden"]), heads=int(s["heads"]),  # type: ignore[call-overload]
                       seq=SEQ, vocab=VOCAB)


def middle_layers(name: str) -> int:
    """Layers of a middle stage: the first and last stages hold one fewer (the paper's setup)."""
    s = setups()[name]
    return (int(s["layers"]) + 2) // int(s["gpus"])  # type: ignore[call-overload]


def fit_constants() -> dict[str, object]:
    """The A100's GEMM efficiency (from ``T_W``: weight-gradient GEMMs alone, the median over the four
    models) and the checks of the rest: ``T_F`` and ``T_B`` predicted with devices.csv's element-wise
    rates (per-operation measurements, reproductions/per_operation), and the element-wise share of HBM
    that ``T_F`` alone would imply for the bytes outside the attention core."""
    a100 = DeviceRates.of("a100")
    gemm, implied, f_err, b_err = [], [], [], []
    for name, t6 in table6().items():
        mms = shape(name).matmuls(_micro(name) * SEQ)
        weight = middle_layers(name) * sum(x.flops for x in mms if x.weight)
        gemm.append(weight / (t6["W"] * a100.peak_flops_bf16))
    e = statistics.median(gemm)
    rates = a100.replace(gemm_efficiency=e)
    for name, t6 in table6().items():
        k, blk = middle_layers(name), block_costs(shape(name), Parallel(microbatch_size=_micro(name)), rates)
        rest_s = t6["F"] - k * (blk.matmul_forward_s + blk.attention_stream_forward_s)
        implied.append(k * blk.elementwise_bytes / (rest_s * a100.hbm_bytes_per_s))
        f_err.append(k * blk.forward_s / t6["F"] - 1)
        b_err.append(k * blk.backward_input_s / t6["B"] - 1)
    return {"gemm_efficiency": e, "gemm_per_model": gemm, "forward_error": f_err,
            "backward_input_error": b_err, "implied_hbm_per_model": implied}


def _micro(name: str) -> int:
    return int(setups()[name]["microbatch_size"])  # type: ignore[call-overload]


class StageTimes(Costs):
    """Per-stage seconds of F, B, W, the optimizer step and the send to the next stage."""

    def __init__(self, f: Sequence[float], b: Sequence[float], w: Sequence[float], u: Sequence[float],
                 send: Sequence[float]) -> None:
        self.f, self.b, self.w, self.u, self.sends = f, b, w, u, send

    def compute(self, worker: int, action: Action, split: bool) -> float:
        s, k = action.stage, action.kind
        if k == "F":
            return self.f[s]
        if k == "B":
            return self.b[s] if split else self.b[s] + self.w[s]
        return self.w[s] if k == "W" else self.u[s]

    def send(self, src: int, dst: int, action: Action) -> tuple[float, int]:
        # F ships forward from stage s, B ships backward from stage s (to s - 1): the same link
        s = action.stage if action.kind == "F" else action.stage - 1
        return (0.0 if src == dst else self.sends[max(s, 0)]), 0

    def allreduce(self, stage: int, workers: tuple[int, ...], grad_s: float) -> tuple[float, float, int]:
        return grad_s, 0.0, 0


def _makespan(method: str, p: int, m: int, costs: StageTimes, virtual: int) -> float:
    if method == ZB_2P:
        times = SearchTimes(costs.f, costs.b, costs.w, send_s=max(costs.sends))
        schedule = search_order(times, m, 2 * p, input_grad_frees=0.5).schedule
    else:
        opts = {"chunks": virtual} if method == "interleaved-1f1b" else {}
        schedule = build(method, p, microbatches=m, **opts)
    events = run(schedule, costs)
    return max(e.end_s for e in events)


def bubble_only(label: str, p: int, m: int, t6: dict[str, float], virtual: int) -> float:
    """Iteration seconds from the bubble's closed form alone (Qi et al. §3; DeepSeek-V3 Table 2)."""
    f, b, w = t6["F"], t6["B"], t6["W"]
    busy = m * (f + b + w)
    bubble = {"1F1B": (p - 1) * (f + b + w), "1F1B-I": (p - 1) * (f + b + w) / virtual,
              "ZB-1p": (p - 1) * max(f + b - 2 * w, 0.0), "ZB-2p": 0.0}[label]
    return busy + bubble


def analytic_costs(name: str, m: int, chunks: int) -> StageTimes:
    """Per (virtual) stage F, B, W, optimizer and send seconds from pipelab.llm alone: the paper's layer
    split, the embedding on the first and the head and loss on the last, dgx-a100 links."""
    s = setups()[name]
    p, b = int(s["gpus"]), _micro(name)  # type: ignore[call-overload]
    n = p * chunks
    model = shape(name)
    cluster = Cluster.preset("dgx-a100", nodes=max(1, n // 8), gpus_per_server=min(n, 8))
    costs = stage_costs(model, Parallel(pipeline=n, microbatch_size=b, microbatches=m), cluster,
                        device="a100", stage_layers=_split(model.layers, n))
    sts = costs.stages
    # device d hosts chunks d, d + p, ...: one optimizer step over all of them, on its first chunk
    u = [sum(sts[j].optimizer_s for j in range(v, n, p)) if v < p else 0.0 for v in range(n)]
    return StageTimes([x.forward_s for x in sts], [x.backward_input_s for x in sts],
                      [x.backward_weight_s for x in sts], u, [x.p2p_s for x in sts])


def _split(layers: int, stages: int) -> list[int]:
    """The paper's split: the first and last (virtual) stages hold one layer fewer than the rest."""
    k = (layers + 2) // stages
    out = [k - 1] + [k] * (stages - 2) + [k - 1] if stages > 1 else [layers]
    extra = layers - sum(out)
    for i in range(abs(extra)):
        out[1 + i % max(stages - 2, 1)] += 1 if extra > 0 else -1
    return out


def predict(virtual: int = 2) -> list[dict[str, object]]:
    """One row per Table 4 cell: measured, bubble-only, table6 and analytic throughput and memory."""
    rows = []
    t6s = table6()
    for cell in table4():
        name, m, label = cell["model"], int(cell["m"]), cell["method"]
        s = setups()[name]
        p, b = int(s["gpus"]), int(s["microbatch_size"])  # type: ignore[call-overload]
        t6 = t6s[name]
        measured = float(cell["samples_per_gpu_per_s"])
        row: dict[str, object] = {"model": name, "m": m, "method": label, "measured": measured,
                                  "bubble": _rate(m, b, p, bubble_only(label, p, m, t6, virtual))}
        method = METHODS.get(label)
        if method is not None:
            chunks = virtual if label == "1F1B-I" else 1
            n = p * chunks
            unit = StageTimes([t6["F"] / chunks] * n, [t6["B"] / chunks] * n, [t6["W"] / chunks] * n,
                              [0.0] * n, [t6["comm"]] * n)
            row["table6"] = _rate(m, b, p, _makespan(method, p, m, unit, virtual))
            analytic = analytic_costs(name, m, chunks)
            row["analytic"] = _rate(m, b, p, _makespan(method, p, m, analytic, virtual))
        schedule = {"1F1B": "1f1b", "1F1B-I": "interleaved", "ZB-1p": "zb-h1", "ZB-2p": "zb-h2"}[label]
        par = Parallel(pipeline=p, microbatch_size=b, microbatches=m, schedule=schedule,
                       virtual=virtual if label == "1F1B-I" else 1)
        model = shape(name)
        per_device = _split(model.layers, p)
        row["memory_gb"] = max(x.total for x in memory_per_device(model, par, stage_layers=per_device)) / 1e9
        row["measured_memory_gb"] = float(cell["memory_gb"])
        rows.append(row)
    return rows


def _rate(m: int, b: int, p: int, seconds: float) -> float:
    """Samples per GPU per second of ``m`` microbatches of ``b`` on ``p`` GPUs in ``seconds``."""
    return m * b / seconds / p


def _err(pred: object, real: float) -> str:
    return "" if pred is None else f"{100 * (float(pred) / real - 1):+.1f}%"  # type: ignore[arg-type]


def write(rows: list[dict[str, object]], fit: dict[str, float], out: Path = HERE) -> None:
    """``table.csv`` and ``table.md`` in ``out`` (the committed reference: beside this script)."""
    keys = ["model", "m", "method", "measured", "bubble", "table6", "analytic", "measured_memory_gb",
            "memory_gb"]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "table.csv", "w", encoding="utf-8", newline="") as fh:
        wr = csv.DictWriter(fh, keys)
        wr.writeheader()
        for r in rows:
            wr.writerow({k: (f"{r[k]:.4g}" if isinstance(r.get(k), float) else r.get(k, "")) for k in keys})
    lines = ["| model | m | method | measured | bubble only | err | pipelab on Table 6 | err | analytic "
             "| err | memory GB measured | predicted | err |", "|" + "---|" * 13]
    for r in rows:
        real = float(r["measured"])  # type: ignore[arg-type]
        mem = r.get("memory_gb")
        lines.append(
            f"| {r['model']} | {r['m']} | {r['method']} | {real:.3g} | {float(r['bubble']):.3g} | "  # type: ignore[arg-type]
            f"{_err(r['bubble'], real)} | {_fmt(r.get('table6'))} | {_err(r.get('table6'), real)} | "
            f"{_fmt(r.get('analytic'))} | {_err(r.get('analytic'), real)} | {r['measured_memory_gb']} | "
            f"{_fmt(mem)} | {_err(mem, float(r['measured_memory_gb']))} |")  # type: ignore[arg-type]
    (out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _fmt(v: object) -> str:
    return "n/a" if v is None else f"{float(v):.3g}"  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    """Fit the GEMM constant, predict Table 4, print the table and write it to ``--out``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--virtual", type=int, default=2, help="chunks per GPU of interleaved 1F1B (not stated)")
    ap.add_argument("--out", default=str(HERE), help="folder for table.md and table.csv")
    args = ap.parse_args(argv)
    fit = fit_constants()
    print(f"GEMM efficiency from T_W: {fit['gemm_efficiency']:.3f} (per model "
          f"{', '.join(f'{x:.3f}' for x in fit['gemm_per_model'])})")  # type: ignore[attr-defined]
    print(f"T_F predicted vs Table 6 (element-wise rates from per-operation measurements): "
          f"{', '.join(f'{x:+.1%}' for x in fit['forward_error'])}")  # type: ignore[attr-defined]
    print(f"  share of HBM T_F alone would imply outside the attention core: "
          f"{', '.join(f'{x:.3f}' for x in fit['implied_hbm_per_model'])}")  # type: ignore[attr-defined]
    print("T_B predicted vs Table 6 (not fitted): "
          + ", ".join(f"{100 * x:+.1f}%" for x in fit["backward_input_error"]))  # type: ignore[attr-defined]
    rows = predict(args.virtual)
    write(rows, fit, Path(args.out))
    print((Path(args.out) / "table.md").read_text(encoding="utf-8"))


if __name__ == "__main__":
    main()

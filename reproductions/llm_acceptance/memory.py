"""Memory per GPU: pipelab.llm's per-device memory against published per-GPU figures of large runs.

Reads ``published_memory.csv`` (each row with its source and what the run did that pipelab does not
model) and compares :func:`pipelab.llm.memory_per_device` of the row's stated configuration with the
published figure. The figures set nothing: they are only compared against. SC'21 and Korthikanti et
al. publish no per-GPU memory figure (Korthikanti draws activation memory as a share, Figure 7); the
Zero Bubble paper's (Table 4) are the development set (reproductions/zero_bubble/).
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def load_memory_rows(path: Path = HERE / "published_memory.csv") -> list[dict[str, str]]:
    """The transcribed published memory figures and their configurations."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def predict_memory(row: dict[str, str], replay: bool = True) -> dict[str, Any]:
    """pipelab's peak per-device memory for ``row``'s configuration, beside the published figure:
    allocated (the closed form) and, with ``replay``, reserved (:func:`pipelab.llm.reserved.reserved_memory`,
    the caching allocator replayed over the step's allocations)."""
    from pipelab.llm import Parallel, Transformer, memory_per_device

    model = Transformer(name=row["row"], layers=int(row["layers"]), hidden=int(row["hidden"]),
                        heads=int(row["heads"]), kv_heads=int(row["kv_heads"]), ffn=int(row["ffn"]),
                        vocab=int(row["vocab"]), seq=int(row["seq"]), tied=False, gated_mlp=True,
                        bias=False, positions=False)
    par = Parallel(tensor=int(row["tensor"]), pipeline=int(row["pipeline"]), data=int(row["data"]),
                   microbatch_size=int(row["microbatch_size"]), microbatches=int(row["microbatches"]),
                   recompute=row["recompute"], sequence_parallel=row["sequence_parallel"] == "true",
                   sharding=row["sharding"])
    worst = max(memory_per_device(model, par, recipe=row["recipe"], attention=row["attention"],
                                  loss=row["loss"], sequence_parallel_inputs=row["sequence_parallel_inputs"],
                                  kernels=row["kernels"]),
                key=lambda m: m.total)
    pub = float(row["published_memory_gib"])
    pred = worst.total / 2**30
    parts = {k: v / 2**30 for k, v in worst.parts().items() if k != "total"}
    replayed = {}
    if replay:
        from pipelab.llm.reserved import reserved_memory

        r = reserved_memory(model, par)
        replayed = {"reserved_replayed_gib": r.peak_reserved / 2**30,
                    "allocated_replayed_gib": r.peak_allocated / 2**30,
                    "reserved_error": r.peak_reserved / 2**30 / pub - 1}
    return {"source": row["source"], "row": row["row"], "gpus": par.devices,
            "config": f"t={par.tensor} p={par.pipeline} d={par.data} b={par.microbatch_size} "
                      f"{par.recompute}{' sp' if par.sequence_parallel else ''} {par.sharding} "
                      f"{row['recipe']} loss {row['loss']} {row['kernels']}"
                      f"{' sp-inputs ' + row['sequence_parallel_inputs'] if par.sequence_parallel else ''}",
            "published_gib": pub, "predicted_gib": pred, "error": pred / pub - 1,
            **{f"{k}_gib": v for k, v in parts.items()}, **replayed}


def memory_table(results: list[dict[str, Any]]) -> str:
    """The comparison as Markdown, with the error summary."""
    lines = ["| source | row | GPUs | configuration | published GiB/GPU (reserved) | allocated, closed form "
             "| error | reserved, allocator replay | error | allocated, replay | of which activations |",
             "|" + "---|" * 11]
    for r in results:
        lines.append(f"| {r['source']} | {r['row']} | {r['gpus']} | {r['config']} | "
                     f"{r['published_gib']:.1f} | {r['predicted_gib']:.1f} | {r['error']:+.1%} | "
                     f"{r['reserved_replayed_gib']:.1f} | {r['reserved_error']:+.1%} | "
                     f"{r['allocated_replayed_gib']:.1f} | {r['activations_gib']:.1f} |")
    reserved = [abs(r["reserved_error"]) for r in results]
    allocated = [abs(r["error"]) for r in results]
    med_r, worst_r = statistics.median(reserved), max(reserved)
    med_a, worst_a = statistics.median(allocated), max(allocated)
    lines += ["", f"memory per GPU, reserved (the published quantity) by the allocator replay: median "
              f"|error| {med_r:.1%}, worst {worst_r:.1%} over {len(reserved)} rows (target: within 10%); "
              f"allocated by the closed form: median {med_a:.1%}, worst {worst_a:.1%}; each row's note in "
              "published_memory.csv says what the run did that pipelab does not model"]
    return "\n".join(lines)


def write_memory(out: Path) -> str:
    """Run every memory row and the measured steps, write ``memory.md`` and ``memory.csv`` into ``out``;
    the Markdown."""
    from reproductions.llm_acceptance.measured_step import measured_table, run_all

    results = [predict_memory(r) for r in load_memory_rows()]
    text = memory_table(results)
    text += ("\n\npipelab's allocated count against a measured training step of a Hugging Face Llama on this "
             "CPU (measured_step.py; kernels='eager', attention='flash', loss='upcast'):\n\n"
             + measured_table(run_all()))
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.md").write_text(text + "\n", encoding="utf-8")
    with open(out / "memory.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=list(results[0]))
        w.writeheader()
        w.writerows(results)
    return text

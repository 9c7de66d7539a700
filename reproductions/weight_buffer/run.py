"""Weight buffers, PipeMare and compression on the digits CNN: accuracy after a few epochs, and bytes.

Trains pipelab's ``small_cnn`` on scikit-learn's bundled digits, split into 4 pipeline stages, with
the runtime's reference executor (``backend="local"``; the multi-process runtime computes the same
weights - see tests/test_runtime_async.py), and prints one row per configuration:

* ``gpipe`` (synchronous, the accuracy to match), ``naive-async`` (no stash, the ablation),
  ``pipemare`` (no stash + T1 learning-rate rescheduling + T2 discrepancy correction), PipeMare with
  one technique at a time, ``pipedream`` (stashing), ``2bw`` and ``buffered`` with K = 3 versions
  (Lv et al., CCGrid'23);
* ``gpipe`` with ``compression="fp16" | "bf16" | "int8"``: test accuracy and the bytes that crossed
  stage boundaries (from the trace).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python reproductions/weight_buffer/run.py [--epochs 6] [--lr 0.04]
[--warmup STEPS] [--decay 0.5] [--quick] [--out DIR]``. Writes ``results_lr<lr>.csv`` and ``.md`` beside
this file (or in ``--out``).
"""

from __future__ import annotations

import argparse
import csv
import functools
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

from pipelab._io import atomic_write_text  # noqa: E402
from pipelab.models.demo import digits_data, small_cnn  # noqa: E402
from pipelab.partition.plan import Plan  # noqa: E402
from pipelab.runtime import train  # noqa: E402

BATCH = 32
STAGES = 4


def model_fn() -> torch.nn.Module:
    """The digits CNN (9 layers)."""
    return small_cnn()


@functools.lru_cache(maxsize=1)
def _train_set() -> tuple[torch.Tensor, torch.Tensor]:
    return digits_data("train")


def make_data(epochs: int, seed: int = 0) -> functools.partial:
    """``data()`` for ``epochs`` passes over the training split, reshuffled per epoch, full batches only."""
    return functools.partial(_data, epochs, seed)


def _data(epochs: int, seed: int = 0):  # type: ignore[no-untyped-def]
    x, y = _train_set()
    for e in range(epochs):
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(1000 * seed + e))
        for i in range(0, len(y) - BATCH + 1, BATCH):
            idx = perm[i:i + BATCH]
            yield x[idx], y[idx]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy."""
    return F.cross_entropy(out, y)


def accuracy(state: dict[str, torch.Tensor]) -> float:
    """Test accuracy of the digits CNN with ``state``."""
    m = model_fn()
    m.load_state_dict(state)
    m.eval()
    x, y = digits_data("test")
    with torch.no_grad():
        return float((m(x).argmax(1) == y).float().mean())


CONFIGS: list[tuple[str, str, dict]] = [
    ("gpipe", "gpipe", {"microbatches": 4}),
    ("naive-async", "naive-async", {}),
    ("pipemare (T1+T2)", "pipemare", {}),
    ("pipemare T1 only", "pipemare", {"discrepancy_correction": False}),
    ("pipemare T2 only", "pipemare", {"lr_reschedule": False}),
    ("pipedream (stash)", "pipedream", {}),
    ("2bw", "2bw", {"microbatches": 4}),
    ("buffered K=3", "buffered", {"microbatches": 4, "versions": 3}),
    ("gpipe fp16", "gpipe", {"microbatches": 4, "compression": "fp16"}),
    ("gpipe bf16", "gpipe", {"microbatches": 4, "compression": "bf16"}),
    ("gpipe int8", "gpipe", {"microbatches": 4, "compression": "int8"}),
]


def main(argv: list[str] | None = None) -> int:
    """Run every configuration and print/write the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--lr", type=float, default=0.04)
    ap.add_argument(
        "--warmup", type=int, default=None, help="PipeMare warm-up steps K (default: the whole run)"
    )
    ap.add_argument("--decay", type=float, default=0.5, help="PipeMare's delta decay gamma")
    ap.add_argument("--seeds", type=int, default=3, help="runs per configuration (init and shuffling seeds)")
    ap.add_argument(
        "--quick", action="store_true", help="one epoch, one seed, three configurations (seconds)"
    )
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    epochs = 1 if args.quick else args.epochs
    steps = epochs * (len(_train_set()[1]) // BATCH)
    warmup = args.warmup if args.warmup is not None else steps
    plan = Plan.even(9, STAGES)
    opt = functools.partial(torch.optim.SGD, lr=args.lr, momentum=0.9)
    rows = []
    configs = CONFIGS[:3] if args.quick else CONFIGS
    print(f"digits CNN, {STAGES} stages {plan.config}, batch {BATCH}, {epochs} epochs = {steps} steps, "
          f"{1 if args.quick else args.seeds} seed(s), "
          f"SGD lr {args.lr} momentum 0.9, PipeMare warm-up {warmup} steps, decay {args.decay}")
    seeds = 1 if args.quick else args.seeds
    for name, method, kw in configs:
        kw = dict(kw)
        if method == "pipemare":
            kw.setdefault("warmup_steps", warmup)
            kw.setdefault("decay", args.decay)
        t = time.time()
        accs, losses = [], []
        for seed in range(seeds):
            r = train(
                model_fn,
                plan,
                method=method,
                data=make_data(epochs, seed),
                loss_fn=loss_fn,
                optimizer=opt,
                steps=steps,
                backend="local",
                progress=False,
                seed=seed,
                **kw,
            )
            accs.append(accuracy(r.state_dict()))
            tail = [x for x in r.losses[-10:]]
            losses.append(sum(tail) / len(tail))
        acc = torch.tensor(accs)
        sent = sum(e.bytes for e in r.trace.compute_events() if e.kind in ("F", "B"))
        row = {
            "config": name,
            "method": method,
            "test_accuracy_mean": round(float(acc.mean()), 4),
            "test_accuracy_min": round(float(acc.min()), 4),
            "test_accuracy_max": round(float(acc.max()), 4),
            "final_loss_mean": round(sum(losses) / len(losses), 4),
            "p2p_bytes": sent,
            "versions_held": max(r.versions_held.values()),
            "seconds": round(time.time() - t, 1),
        }
        rows.append(row)
        print(f"  {name:20s} acc {float(acc.mean()):.4f} [{float(acc.min()):.4f}, {float(acc.max()):.4f}]  "
              f"loss {row['final_loss_mean']:.4f}  bytes {sent:>10d}  versions {row['versions_held']}  "
              f"({row['seconds']} s)", flush=True)
    base = rows[0]
    for r_ in rows:
        r_["acc_minus_gpipe"] = round(r_["test_accuracy_mean"] - base["test_accuracy_mean"], 4)
        r_["bytes_vs_gpipe"] = (
            round(r_["p2p_bytes"] / base["p2p_bytes"], 4) if r_["method"] == "gpipe" else ""
        )
    args.out.mkdir(parents=True, exist_ok=True)
    fields = list(rows[0])
    lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(str(r_[f]) for f in fields) + " |" for r_ in rows]
    stem = f"results_lr{args.lr:g}"
    atomic_write_text(args.out / f"{stem}.md", "\n".join(lines) + "\n")
    import io
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(args.out / f"{stem}.csv", buf.getvalue())
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

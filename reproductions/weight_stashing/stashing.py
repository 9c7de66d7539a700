"""Statistical efficiency of the weight policies: digits CNN over 4 stages, accuracy per epoch.

Claims: PipeDream (SOSP'19) §3.3/§5 (weight stashing vs naive pipelining), PipeMare (MLSys'21) §3.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from torch import nn


from pipelab.graph import layer_nodes, trace
from pipelab.models import digits_data, small_cnn
from pipelab.models.demo import batches
from pipelab.partition.plan import Plan
from pipelab.runtime import supported_methods
from pipelab.runtime.guards import NonFiniteError
from pipelab.runtime.launch import train
from reproductions.pipedream_table1.measure import cross_entropy

CHANCE = 0.1   # test accuracy of a diverged run: ten digit classes, one predicted


def parse_method(spec: str) -> tuple[str, dict[str, Any]]:
    """``"pipedream+vertical_sync"`` -> ``("pipedream", {"vertical_sync": True})``;
    ``"buffered:3"`` -> K=3."""
    name, *flags = spec.split("+")
    opts: dict[str, Any] = {f: True for f in flags}
    if ":" in name:
        name, k = name.split(":", 1)
        opts["versions"] = int(k)
    return name, opts


def digits_model(channels: int = 16, state_path: str | None = None) -> nn.Module:
    """The digits CNN (``pl.models.small_cnn``), optionally starting from saved weights (a ``model_fn``).

    Its initial weights come from torch's global generator, which ``pl.train`` seeds with its ``seed``
    on every worker before calling a ``model_fn``.
    """
    import torch


    net = small_cnn(channels=channels)
    if state_path:
        net.load_state_dict(torch.load(state_path, weights_only=True))
    return net


def digits_epoch(epoch: int, *, batch_size: int = 32, seed: int = 0, limit: int = 0) -> list[tuple[Any, Any]]:
    """Epoch ``epoch`` of the digits training split as minibatches, shuffled reproducibly (a ``data``
    callable).

    Only whole minibatches are returned, so every minibatch splits into equal microbatches.
    """

    x, y = digits_data("train", seed=seed)
    if limit:
        x, y = x[:limit], y[:limit]
    out = batches((x, y), batch_size, seed=seed * 1000 + epoch)
    return [(a, b) for a, b in out if len(a) == batch_size]


def digits_accuracy(net: nn.Module, *, seed: int = 0) -> float:
    """Accuracy of ``net`` on the digits test split."""
    import torch


    x, y = digits_data("test", seed=seed)
    net.eval()
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


def stash_plan(method: str, stages: int, num_layers: int) -> Plan:
    """The plan a weight-stashing run uses: ``stages`` replicas of the whole model for ``dp``, else
    ``stages`` contiguous stages of near-equal layer counts."""

    if method == "dp":
        return Plan.from_boundaries(num_layers, [], replicas=[stages], method="dp")
    return Plan.even(num_layers, stages, method=method)


def stash_experiment(methods: Sequence[str], *, stages: int = 4, epochs: int = 8, batch_size: int = 32,
                     lr: float = 0.1, momentum: float = 0.0, channels: int = 16, train_limit: int = 0,
                     backend: str = "local", seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """Train the digits CNN with each method for ``epochs`` epochs; test accuracy after every epoch.

    Epoch ``e`` is one ``pl.train`` call for ``e`` epochs' worth of steps that resumes from the
    checkpoint the previous call wrote at its end (``resume=``, ``checkpoint_every=``): weights,
    optimizer state, weight versions and the data position carry over, so the only difference from
    one uninterrupted run is that the pipeline drains at each epoch's end (as a real run does for
    an evaluation). Rows: method, epoch, test_accuracy, train_loss (mean over the epoch's steps).
    Methods the runtime cannot run (``pipelab.runtime.supported_methods()``) are left out, and said so.
    """
    import pandas as pd
    import torch
    from tqdm.auto import tqdm


    missing = [m for m in methods if parse_method(m)[0] not in supported_methods()]
    if missing:
        print(f"not run: {', '.join(missing)} (the runtime supports {', '.join(supported_methods())})")
        methods = [m for m in methods if m not in missing]
    num_layers = len(layer_nodes(trace(digits_model(channels))))
    per_epoch = len(digits_epoch(0, batch_size=batch_size, seed=seed, limit=train_limit))
    data = functools.partial(digits_epochs, epochs, batch_size=batch_size, seed=seed, limit=train_limit)
    rows = []
    bar = tqdm(total=len(methods) * epochs, desc="weight stashing", disable=not progress)
    with tempfile.TemporaryDirectory() as tmp:
        for spec in methods:
            name, opts = parse_method(spec)
            plan = stash_plan(name, stages, num_layers)
            micro = stages if name in ("dp", "gpipe", "1f1b-flush", "2bw", "buffered") else 1
            if name == "pipemare":
                # PipeMare's learning-rate warm-up (T1, §3) over the whole run, as in ../weight_buffer/run.py
                opts.setdefault("warmup_steps", per_epoch * epochs)
            ckpt = str(Path(tmp) / spec.replace("+", "_").replace(":", "_"))
            for epoch in range(epochs):
                resume: dict[str, Any] = {"resume": ckpt} if epoch else {}
                try:
                    run = train(functools.partial(digits_model, channels), plan, method=name, data=data,
                                loss_fn=cross_entropy,
                                optimizer=functools.partial(torch.optim.SGD, lr=lr, momentum=momentum),
                                steps=per_epoch * (epoch + 1), microbatches=micro, backend=backend, seed=seed,
                                progress=False, checkpoint_every=per_epoch, checkpoint_dir=ckpt,
                                **resume, **opts)
                except NonFiniteError as exc:   # diverged: it predicts one class from here on (chance)
                    print(f"{spec} diverged in epoch {epoch + 1} (seed {seed}, lr {lr}): {exc}")
                    rows += [{"method": spec, "epoch": e + 1, "test_accuracy": CHANCE,
                              "train_loss": float("nan")} for e in range(epoch, epochs)]
                    bar.update(epochs - epoch)
                    break
                state = str(Path(tmp) / "weights.pt")
                torch.save(run.state_dict(), state)
                losses = [float(v) for v in run.losses]
                rows.append(
                    {
                        "method": spec,
                        "epoch": epoch + 1,
                        "test_accuracy": round(digits_accuracy(digits_model(channels, state), seed=seed), 4),
                        "train_loss": round(sum(losses) / max(len(losses), 1), 4),
                    }
                )
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


def mean_over_seeds(curves: pd.DataFrame) -> pd.DataFrame:
    """Per method and epoch, the mean test accuracy and train loss over the ``seed`` column (and the
    accuracy's spread, max - min), methods in their first order."""
    order = list(dict.fromkeys(curves["method"]))
    g = curves.groupby(["method", "epoch"])
    out = g[["test_accuracy", "train_loss"]].mean().round(4)
    out["accuracy_spread"] = (g["test_accuracy"].max() - g["test_accuracy"].min()).round(4)
    out = out.reset_index()
    out["method"] = out["method"].astype("category").cat.set_categories(order)
    return out.sort_values(["method", "epoch"]).astype({"method": str}).reset_index(drop=True)


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
        lines.append(
            "claim 'PipeMare closes the gap without stashing': "
            + ("HOLDS here" if holds else "does NOT hold here")
        )
    return "\n".join(lines)


def digits_epochs(
    epochs: int, *, batch_size: int = 32, seed: int = 0, limit: int = 0
) -> list[tuple[Any, Any]]:
    """``epochs`` consecutive epochs of :func:`digits_epoch` as one list (a ``data`` callable)."""
    return [b for e in range(epochs) for b in digits_epoch(e, batch_size=batch_size, seed=seed, limit=limit)]

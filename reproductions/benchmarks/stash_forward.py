"""What running on a stashed weight version costs: ``torch.func.functional_call`` against the runtime's
:class:`~pipelab.runtime.reparam.Reparametrizer`, and the weight policies' byte accounting.

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 python reproductions/benchmarks/stash_forward.py [--calls 400]

For each stage of the models of ``reproductions/sim_accuracy`` cut in two (the digits CNN, the
4-block transformer), prints the median seconds of one forward (no gradient recorded, so the call's own
overhead is not hidden behind autograd) through the plain module, ``functional_call`` on a weight dict
(what the runtime did before) and the ``Reparametrizer`` (what it does now), and what a stashing
policy's byte accounting costs per action: a full recount over every stored tensor (before) against
the check that nothing changed (now). Medians of ``--rounds`` rounds, each the mean of ``--calls``
calls, interleaved.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from torch.func import functional_call

from pipelab.graph import StageModule, as_tuple, layer_nodes, trace
from pipelab.runtime.policies.base import Stashing
from pipelab.runtime.reparam import Reparametrizer
from reproductions.sim_accuracy.accuracy import MODELS


def per_call(fn: Any, calls: int) -> float:
    """Seconds per call of ``fn`` after a quarter as many warm-up calls."""
    for _ in range(calls // 4):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def stages(model: str) -> list[tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]:
    """The model's two halves (by layer count) with an input of each, as the runtime cuts them."""
    model_fn, data_fn, _, batch = MODELS[model]
    torch.manual_seed(0)
    gm = trace(model_fn())
    total = len(layer_nodes(gm))
    x, _ = data_fn(batch)[0]
    out: list[tuple[torch.nn.Module, tuple[torch.Tensor, ...]]] = []
    inputs: tuple[torch.Tensor, ...] = (x,)
    for start, end in [(0, total // 2), (total // 2, total)]:
        mod = StageModule(gm, start, end)
        out.append((mod, inputs))
        with torch.no_grad():
            inputs = as_tuple(mod(*inputs))
    return out


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'stage':16s} {'tensors':>7s} {'plain':>9s} {'functional_call':>16s} {'Reparametrizer':>15s} "
          f"{'recount':>9s} {'check':>7s}   (us)")
    for model in MODELS:
        for i, (mod, xs) in enumerate(stages(model)):
            params = dict(mod.named_parameters())
            w = {n: p.detach().clone().requires_grad_() for n, p in params.items()}
            rep = Reparametrizer(mod)
            pol = Stashing(params, i)
            pol.in_flight = {0: 0}
            pol.about_to_update()
            pol.updated()                      # two versions held, as in a pipeline's steady state
            runs: dict[str, list[float]] = {k: [] for k in ("plain", "fc", "rep", "recount", "check")}
            with torch.no_grad():
                for _ in range(args.rounds):
                    runs["plain"].append(per_call(lambda m=mod, x=xs: m(*x), args.calls))
                    runs["fc"].append(per_call(lambda m=mod, w=w, x=xs: functional_call(m, w, x), args.calls))
                    runs["rep"].append(per_call(lambda r=rep, w=w, x=xs: r(w, *x), args.calls))
                    runs["recount"].append(per_call(pol.weight_bytes, args.calls))
                    runs["check"].append(per_call(pol._measure, args.calls))
            med = {k: statistics.median(v) * 1e6 for k, v in runs.items()}
            print(f"{model + ' stage ' + str(i):16s} {len(params):7d} {med['plain']:9.1f} {med['fc']:16.1f} "
                  f"{med['rep']:15.1f} {med['recount']:9.1f} {med['check']:7.1f}", flush=True)


if __name__ == "__main__":
    main()

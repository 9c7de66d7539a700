"""Distance from plain SGD of a tied GPT trained through pipelab on gloo processes (issue 44's figure).

The 4-block GPT of ``pipelab.models.gpt`` (D 32, vocab 97, head tied to the embedding), cut after its
second block into two stages, trained for 4 minibatches of SGD (lr 0.1, 8 samples, M = 2) with gpipe
and 1f1b-flush on 2 gloo processes; printed: the largest weight difference from the same model trained
in one process, and the same for an explicitly untied copy (the control).

Run: ``PYTHONPATH=. python reproductions/tied_embeddings/distance.py``. ``--model-file path/to/gpt.py``
takes the model from a file instead (to measure a pipelab that has no ``pipelab.models.gpt``).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch
from torch import nn

import pipelab as pl
from pipelab.graph import layer_nodes, trace

STEPS, BATCH, LR = 4, 8, 0.1


def _gpt_module(path: str | None):  # type: ignore[no-untyped-def]
    if path is None:
        return importlib.import_module("pipelab.models.gpt")
    spec = importlib.util.spec_from_file_location("tied_gpt_model", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tied_gpt_model"] = mod
    spec.loader.exec_module(mod)
    return mod


G = _gpt_module(next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--model-file=")), None))


def tied() -> nn.Module:
    """The tied GPT."""
    return G.gpt()


def untied() -> nn.Module:
    """The same GPT with the head's own copy of the initial matrix."""
    m = G.gpt()
    m.head.weight = nn.Parameter(m.wte.weight.detach().clone())
    return m


def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four deterministic minibatches."""
    x, y = G.gpt_data(STEPS * BATCH, seed=1)
    return [(x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]) for i in range(STEPS)]


def sgd(params) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    """SGD, lr 0.1."""
    return torch.optim.SGD(params, lr=LR)


def plain(model_fn) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    """One process, whole minibatches, the runtime's seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        m = model_fn()
    opt = sgd(m.parameters())
    for x, y in data():
        opt.zero_grad()
        G.gpt_loss(m(x), y).backward()
        opt.step()
    return m.state_dict()


def main() -> None:
    argparse.ArgumentParser(description=__doc__).parse_known_args()
    nodes = layer_nodes(trace(tied()))
    cut = [i + 1 for i, n in enumerate(nodes) if n.name == "add_4"][0]    # after the second block
    plan = pl.Plan.from_boundaries(len(nodes), [cut])
    for name, fn in (("tied", tied), ("untied", untied)):
        want = plain(fn)
        for method in ("gpipe", "1f1b-flush"):
            try:
                res = pl.train(fn, plan, method=method, data=data, loss_fn=G.gpt_loss, optimizer=sgd,
                               steps=STEPS, microbatches=2, backend="gloo", progress=False, timeout=120)
            except Exception as exc:   # an older pipelab may refuse: print it
                print(f"{name:7s} {method:11s} error: {type(exc).__name__}: {str(exc)[:160]}")
                continue
            got = res.state_dict()
            d = max(float((got[k] - want[k]).abs().max()) for k in want)
            print(f"{name:7s} {method:11s} max |w - w_plain| = {d:.2e}")


if __name__ == "__main__":
    main()

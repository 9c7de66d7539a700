"""The "honest" PipeDream Table 1: pipelab's partitioner on PipeDream's own profiles, beside the paper.

For VGG-16, ResNet-50, GNMT-8 and GNMT-16 (PipeDream's shipped ``graph.txt`` profiles) on clusters
A and B (PipeDream SOSP'19 §5.1), print: the configuration pipelab's ``"pipedream"`` partitioner
chooses (device memory enforced), its predicted speed-up over data parallelism (DP), the same
without the memory limit, the paper's configuration and speed-up (Table 1), pipelab's prediction
for the paper's configuration, and the cost-model terms that explain a difference.

Run: ``python reproductions/partition_table.py [--speed S] [--write]`` (``--write`` also saves
``reproductions/partition_table.md``). ``--speed`` is the V100's speed relative to the GPU the
profiles were measured on (1.0: the profile's device; PipeDream does not say which GPU that was).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from pathlib import Path

from pipelab._io import atomic_write_text
from pipelab.cluster import Cluster
from pipelab.partition import partition
from pipelab.partition._evaluate import build_plan
from pipelab.partition.dp import dp_time_s
from pipelab.profile.records import Profile
from pipelab.sim.costs import CostModel

# (model, preset, servers, gpus, paper config, paper speed-up) -- PipeDream SOSP'19 Table 1
ROWS = [
    ("vgg16", "pipedream-a", 4, 4, "15-1", 5.28),
    ("vgg16", "pipedream-b", 2, 8, "15-1", 2.98),
    ("resnet50", "pipedream-a", 4, 4, "16", 1.0),
    ("resnet50", "pipedream-b", 2, 8, "16", 1.0),
    ("gnmt8", "pipedream-a", 4, 4, None, None),
    ("gnmt8", "pipedream-a", 1, 4, "straight", 1.5),
    ("gnmt8", "pipedream-a", 3, 4, "straight", 2.95),
    ("gnmt8", "pipedream-b", 2, 8, "16", 1.0),
    ("gnmt16", "pipedream-a", 4, 4, None, None),
    ("gnmt16", "pipedream-a", 1, 4, "straight", 1.46),
    ("gnmt16", "pipedream-b", 2, 8, "straight", 3.14),
]


def paper_config_time(cm: CostModel, config: str) -> float:
    """pipelab's predicted seconds per minibatch for the paper's configuration (best layer split)."""
    W, n = cm.cluster.num_workers, cm.num_layers
    if config == str(W):
        return dp_time_s(cm, range(W))
    if config == "straight":
        from pipelab.partition.pipedream import solve

        return solve(cm, straight=True, memory_limit=math.inf)[0]
    reps = [int(r) for r in config.split("-")]
    best = math.inf
    for bounds in itertools.combinations(range(1, n), len(reps) - 1):
        best = min(best, build_plan(cm, list(bounds), reps, method="x", dp_time=1.0).time_per_minibatch)
    return best


def explain(cm: CostModel, plan_free_time: float) -> str:
    """The DP baseline's terms: compute per replica, all-reduce, the part not hidden by backward."""
    W, n = cm.cluster.num_workers, cm.num_layers
    comp = float(cm.pf[n] + cm.pb[n]) / cm.cluster.speed(0)
    ar = cm.allreduce_s(int(cm.pp[n]), range(W))
    rep = cm.replica_time_s(0, n, range(W))
    return (f"DP: compute {comp * 1e3:.0f} ms + all-reduce {ar * 1e3:.0f} ms of {cm.pp[n] / 1e6:.0f} MB, "
            f"{(rep - comp) * 1e3:.0f} ms exposed -> {rep / W * 1e3:.1f} ms/minibatch; "
            f"best pipeline (no memory limit) {plan_free_time * 1e3:.1f} ms")


def table(speed: float = 1.0) -> str:
    """The table as markdown."""
    lines = [f"Device speed {speed:g} x the profiling GPU. Times: ms per minibatch (1/throughput).", "",
             "| model (batch) | cluster | pipelab config | speed-up | no mem. limit: config, speed-up | "
             "paper config | paper speed-up | pipelab on paper config | why |",
             "|---|---|---|---|---|---|---|---|---|"]
    profiles: dict[str, Profile] = {}
    for model, preset, s, g, pconf, pspeed in ROWS:
        prof = profiles.setdefault(model, Profile.from_pipedream(model))
        cl = Cluster.preset(preset, servers=s, gpus_per_server=g, speed=speed)
        cm = CostModel(prof, cl)
        try:
            plan = partition(prof, cl, "pipedream")
            mem = f"{plan.config} | {plan.speedup_over_dp:.2f}x"
        except ValueError:
            mem = "none fits | -"
        free = partition(prof, cl, "pipedream", memory_limit=math.inf)
        dp = dp_time_s(cm, range(cl.num_workers))
        if pconf is not None:
            pc = pconf if pconf != "16" else str(cl.num_workers)
            on_paper = f"{pc}: {dp / paper_config_time(cm, pc):.2f}x"
        else:
            on_paper = "-"
        lines.append(f"| {model} ({prof.batch_size}) | {preset[-1].upper()} {s}x{g} | {mem} | "
                     f"{free.config}, {free.speedup_over_dp:.2f}x | {pconf or '-'} | "
                     f"{f'{pspeed:.2f}x' if pspeed else '-'} | {on_paper} | "
                     f"{explain(cm, free.time_per_minibatch)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Print the table for ``--speed`` values (default 1 and 4); ``--write`` saves it as markdown."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", type=float, action="append", help="V100 speed / profiling GPU speed")
    ap.add_argument("--write", action="store_true", help="also write reproductions/partition_table.md")
    args = ap.parse_args(argv)
    parts = ["# PipeDream Table 1, predicted by pipelab's partitioner", "",
             "Generated by `python reproductions/partition_table.py --write`; see that script's docstring.", ""]
    for sp in args.speed or [1.0, 4.0]:
        parts += [table(sp), ""]
    text = "\n".join(parts)
    print(text)
    if args.write:
        atomic_write_text(Path(__file__).with_name("partition_table.md"), text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

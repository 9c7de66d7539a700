"""PipeDream's own stage configurations (``pipelab/data/pipedream/``, MIT licence) as pipelab plans.

A profile's parameter-carrying layers are dealt to the stages by the stages' module counts, whose
class names must match; each boundary lies before the next stage's first parameter-carrying layer.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pipelab.costs import CostModel
from pipelab.partition.plan import Plan
from pipelab.partition.predict import build_plan
from pipelab.profile.pipedream_format import DATA_DIR
from pipelab.profile.records import Profile

#: the index of shipped configurations (written by pipelab from PipeDream's files)
INDEX = DATA_DIR / "stage_configs.json"


@dataclass(frozen=True)
class PipeDreamConfig:
    """One of PipeDream's stage configurations: ranks and parameter-carrying module classes per stage."""

    name: str                                   # e.g. "vgg16/gpus=16/hybrid_conf"
    profile: str                                # the shipped profile it is for (vgg16, gnmt8, gnmt16)
    stage_to_rank_map: dict[int, tuple[int, ...]]
    stage_modules: tuple[tuple[str, ...], ...]
    upstream: str                               # its path in msr-fiddle/pipedream
    driver: str                                 # the driver config that names it
    derived: str = ""                           # how it was read when the named file is absent

    @property
    def replicas(self) -> tuple[int, ...]:
        """Ranks per stage."""
        return tuple(len(self.stage_to_rank_map[s]) for s in range(len(self.stage_modules)))


def available() -> tuple[str, ...]:
    """Names of the shipped configurations."""
    return tuple(json.loads(INDEX.read_text())["configs"])


def load_config(name: str) -> PipeDreamConfig:
    """A shipped configuration by name (see :func:`available`), its rank map read from PipeDream's file."""
    configs = json.loads(INDEX.read_text())["configs"]
    if name not in configs:
        raise ValueError(f"no shipped PipeDream configuration {name!r}; choose one of {', '.join(configs)}")
    entry: dict[str, Any] = configs[name]
    conf = json.loads((DATA_DIR / entry["file"]).read_text()) if entry.get("file") else entry
    ranks = {int(k): tuple(int(r) for r in v) for k, v in conf["stage_to_rank_map"].items()}
    modules = tuple(tuple(m) for m in entry["stage_modules"])
    stages_in_map = sorted(set(int(s) for s in conf["module_to_stage_map"]))
    if stages_in_map != list(range(len(modules))) or sorted(ranks) != stages_in_map:
        raise ValueError(f"configuration {name!r}: module_to_stage_map names stages {stages_in_map}, "
                         f"stage_to_rank_map {sorted(ranks)}, and {len(modules)} stage modules are listed")
    return PipeDreamConfig(name=name, profile=entry["profile"], stage_to_rank_map=ranks,
                           stage_modules=modules, upstream=entry["upstream"], driver=entry["driver"],
                           derived=entry.get("derived", ""))


def stage_bounds(profile: Profile, config: PipeDreamConfig) -> list[int]:
    """The layer indices where the config's stages 1.. start in ``profile`` (see the module docstring)."""
    weighted = [i for i, layer in enumerate(profile.layers) if layer.param_bytes > 0]
    counts = [len(m) for m in config.stage_modules]
    if sum(counts) != len(weighted):
        raise ValueError(f"configuration {config.name!r} has {sum(counts)} parameter-carrying modules but "
                         f"profile {profile.model or '?'} has {len(weighted)} parameter-carrying layers; "
                         f"use the profile the configuration was made for ({config.profile})")
    bounds, k = [], 0
    for s, mods in enumerate(config.stage_modules):
        mine = weighted[k:k + len(mods)]
        kinds = Counter(profile.layers[i].kind for i in mine)
        if kinds != Counter(mods):
            raise ValueError(f"configuration {config.name!r}, stage {s}: its modules {sorted(mods)} do not "
                             f"match the profile's layers {sorted(kinds.elements())} in that position")
        if s > 0:
            bounds.append(mine[0])
        k += len(mods)
    return bounds


def plan_from_pipedream(profile: Profile, config: PipeDreamConfig | str, cm: CostModel | None = None) -> Plan:
    """PipeDream's configuration as a :class:`Plan` of ``profile`` (ranks server-major, as PipeDream's
    map); with ``cm`` (``profile`` on the cluster it runs on), with the cost model's predictions."""
    cfg = load_config(config) if isinstance(config, str) else config
    bounds = stage_bounds(profile, cfg)
    order = [r for s in range(len(cfg.stage_modules)) for r in cfg.stage_to_rank_map[s]]
    notes = {"pipedream_config": cfg.name, "upstream": cfg.upstream, "driver": cfg.driver}
    if cm is not None:
        if cm.profile is not profile and cm.profile.fingerprint() != profile.fingerprint():
            raise ValueError("cm must be a cost model of this profile")
        if max(order) >= cm.cluster.num_workers:
            raise ValueError(f"configuration {cfg.name!r} uses ranks up to {max(order)} but cluster "
                             f"{cm.cluster.name!r} has {cm.cluster.num_workers} workers")
        return build_plan(cm, bounds, cfg.replicas, method="pipedream-config", ranks_of=order, notes=notes)
    plan = Plan.from_boundaries(len(profile), bounds, cfg.replicas, method="pipedream-config",
                                batch_size=profile.batch_size, model=profile.model,
                                profile_fingerprint=profile.fingerprint(), notes={**notes, "workers": order})
    return plan

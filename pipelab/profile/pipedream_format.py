"""PipeDream's ``graph.txt`` profiles as :class:`~pipelab.profile.records.Profile` records.

The format and its parser are :mod:`pipelab.profile.pipedream_graph`; this module builds the record.
"""

from __future__ import annotations

import os

from pipelab.profile.pipedream_graph import (
    DATA_DIR,
    SHIPPED,
    GraphNode,
    PipeDreamGraph,
    infer_batch_size,
    parse_graph,
    profile_fields,
    shipped,
)
from pipelab.profile.records import Profile

__all__ = ["DATA_DIR", "SHIPPED", "GraphNode", "PipeDreamGraph", "infer_batch_size", "load_pipedream",
           "parse_graph", "shipped", "to_profile"]


def to_profile(graph: PipeDreamGraph, *, batch_size: int | None = None, model: str = "",
               source: str = "pipedream") -> Profile:
    """Linearize a parsed graph into a :class:`Profile` (ms -> s; cuts count distinct tensors)."""
    return Profile.from_fields(profile_fields(graph, batch_size=batch_size, model=model, source=source))


def load_pipedream(path: str | os.PathLike[str], batch_size: int | None = None,
                   model: str | None = None) -> Profile:
    """Load a PipeDream ``graph.txt`` (a path, or a shipped name such as ``"vgg16"``) as a Profile.

    ``batch_size`` overrides the minibatch inferred from the file (1 when nothing can be inferred);
    times stay per minibatch of that size.
    """
    return Profile.from_pipedream(path, batch_size=batch_size, model=model)

"""PipeDream's ``graph.txt`` profiles as Profile records (format and parser: :mod:`.pipedream_graph`)."""

from __future__ import annotations

import os

from pipelab.profile.pipedream_graph import (
    DATA_DIR,
    SHIPPED,
    GraphNode,
    PipeDreamGraph,
    infer_batch_size,
    parse_graph,
    shipped,
)
from pipelab.profile.records import Profile

__all__ = ["DATA_DIR", "SHIPPED", "GraphNode", "PipeDreamGraph", "infer_batch_size", "load_pipedream",
           "parse_graph", "shipped"]


def load_pipedream(path: str | os.PathLike[str], batch_size: int | None = None,
                   model: str | None = None) -> Profile:
    """Load a PipeDream ``graph.txt`` (a path, or a shipped name such as ``"vgg16"``) as a Profile;
    ``batch_size`` overrides the inferred one."""
    return Profile.from_pipedream(path, batch_size=batch_size, model=model)

"""Checks of a measured profile that a partition would otherwise hide: a layer too big to split (a plan
cuts between layers, never inside one, so such a layer's time lands on one worker whatever the plan)."""

from __future__ import annotations

import warnings
from typing import Any

from pipelab.graph import layer_nodes
from pipelab.profile.records import Profile

#: the share of the model's time above which one layer is warned about
DOMINANT_SHARE = 0.5


def warn_dominant_layer(profile: Profile, gm: Any = None, share: float = DOMINANT_SHARE) -> None:
    """Warn when one layer holds more than ``share`` of the model's forward and backward time.

    With the traced model ``gm``, only a layer that has children to expose is warned about (a lone
    convolution may well be most of a small model, and nothing can split it)."""
    total = profile.fwd_s + profile.bwd_s
    if len(profile) < 2 or total <= 0:
        return
    i, layer = max(enumerate(profile.layers), key=lambda t: t[1].fwd_s + t[1].bwd_s)
    part = (layer.fwd_s + layer.bwd_s) / total
    if part <= share:
        return
    if gm is not None:
        node = layer_nodes(gm)[i]
        if node.op != "call_module" or not any(True for _ in gm.get_submodule(str(node.target)).children()):
            return
    warnings.warn(
        f"layer {i} ({layer.name}, {layer.kind}) holds {part:.0%} of the model's time, and a plan cannot "
        "cut inside a layer, so one stage will hold it whole. Expose its children: build it as an "
        "nn.ModuleList / nn.Sequential of blocks (e.g. the encoder layers themselves instead of "
        "nn.TransformerEncoder, whose forward profiles as one call), or pass depth= / leaf_modules= to "
        "pl.profile", UserWarning, stacklevel=3)

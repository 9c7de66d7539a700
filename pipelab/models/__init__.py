"""The model zoo: the papers' models (VGG-16, ResNet-50, GNMT-8/16), small demo models and data (a tied
GPT among them, and one that splits over a tensor-parallel group), and PipeDream's measured profiles
(:func:`pipedream_profile`). Nothing here downloads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from pipelab.models.demo import (
    PlainBlock,
    digits_data,
    mlp,
    plain_gpt,
    small_cnn,
    synthetic_translation,
    tiny_transformer,
)
from pipelab.models.gnmt import GNMT, gnmt, gnmt_param_count
from pipelab.models.gpt import GPT, gpt, gpt_data, gpt_loss
from pipelab.models.tp_gpt import SplittableGPT, splittable_gpt
from pipelab.models.vision import resnet50, vgg16
from pipelab.profile.pipedream_format import load_pipedream, shipped
from pipelab.profile.records import Profile

__all__ = ["GNMT", "GPT", "REGISTRY", "build", "digits_data", "example", "gnmt", "gnmt_param_count", "gpt",
           "gpt_data", "gpt_loss", "mlp",
           "PlainBlock", "pipedream_profile", "plain_gpt", "resnet50", "small_cnn", "SplittableGPT",
           "splittable_gpt",
           "synthetic_translation", "tiny_transformer", "vgg16"]

#: name -> builder, for the CLI and notebooks (keyword arguments pass through)
REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "vgg16": vgg16, "resnet50": resnet50, "gnmt8": lambda **kw: gnmt(num_layers=8, **kw),
    "gnmt16": lambda **kw: gnmt(num_layers=16, **kw), "mlp": mlp, "small_cnn": small_cnn,
    "tiny_transformer": tiny_transformer, "gpt": gpt, "splittable_gpt": splittable_gpt,
}


def build(name: str, **kwargs: Any) -> nn.Module:
    """Build a zoo model by name (``vgg16``, ``resnet50``, ``gnmt8``, ``gnmt16``, ``mlp``, ...)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(REGISTRY)}")
    return REGISTRY[name](**kwargs)


def pipedream_profile(name: str, *, batch_size: int | None = None) -> Profile:
    """PipeDream's measured profile of ``vgg16``, ``resnet50``, ``alexnet``, ``gnmt8`` or ``gnmt16``."""
    return load_pipedream(shipped(name), batch_size=batch_size, model=name)


def example(name: str, batch: int, *, image_size: int = 224, seq_len: int = 24, vocab: int | None = None,
            hidden: int | None = None, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A zoo model and one minibatch of sample input for it, e.g. ``pl.profile(*example("vgg16", 8))``;
    ``vocab`` and ``hidden`` resize GNMT (default 32000 and 1024), ``vocab`` the tiny Transformer
    and the GPT."""
    if batch < 1:
        raise ValueError(f"batch={batch} must be >= 1")
    g = torch.Generator().manual_seed(seed)
    if name in ("vgg16", "resnet50"):
        if image_size < 32:
            raise ValueError(f"image_size={image_size} is too small for {name}; use 32 or more")
        return build(name), (torch.randn(batch, 3, image_size, image_size, generator=g),)
    if name in ("gnmt8", "gnmt16"):
        kw: dict[str, Any] = {k: v for k, v in (("vocab", vocab), ("hidden", hidden)) if v is not None}
        src, tgt_in, _ = synthetic_translation(batch, vocab=kw.get("vocab", 32000), src_len=seq_len,
                                               seed=seed)
        return build(name, **kw), (src, tgt_in)
    if name == "mlp":
        return build(name), (torch.randn(batch, 64, generator=g),)
    if name == "small_cnn":
        x, _ = digits_data()
        return build(name), (x[torch.arange(batch) % len(x)],)
    if name == "tiny_transformer":
        v = vocab or 100
        tokens = torch.randint(0, v, (batch, seq_len), generator=g)
        return tiny_transformer(vocab=v, max_len=max(64, seq_len)), (tokens,)
    if name == "gpt":
        tokens, _ = gpt_data(batch, vocab=vocab or 97, seq_len=seq_len, seed=seed)
        return gpt(vocab=vocab or 97, max_len=seq_len), (tokens,)
    raise ValueError(f"unknown model {name!r}; choose one of {', '.join(REGISTRY)}")

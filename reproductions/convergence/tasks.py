"""The convergence grid's two tasks, built from nothing that downloads.

* ``chars``: next-character prediction on Python's own standard-library sources (the text of a
  fixed list of pure-Python modules, read with :mod:`inspect`), a small causal Transformer that
  reads a window of ``CONTEXT`` characters and predicts the character after every position (the
  training loss averages all ``CONTEXT`` targets of a window; the causal mask keeps each target out
  of its own input). Accuracy: the prediction after the whole window (the last position) on a
  held-out tail of the text. Always predicting a space gets 0.332 there, a bigram table (the most
  frequent next character after each character, counted on the training text) 0.396.
* ``shapes``: 12x12 grayscale images of one of four shapes (filled square, hollow square, plus,
  diagonal cross) of random size at a random place, in Gaussian noise; a small residual CNN (no
  batch normalization, so microbatching changes nothing). Translation makes the classes not
  linearly separable in pixel space: a linear classifier on the pixels reaches 0.585
  (:func:`linear_baseline`), the CNN above 0.9 with data parallelism.

Every task is ``(model_fn, train_epoch(epoch, seed) -> minibatches, evaluate(net, seed) -> accuracy)``.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn

BATCH = 32
CONTEXT = 32
#: stdlib modules whose source is the text (pure Python, present in every CPython 3.10+)
TEXT_MODULES = ("textwrap", "string", "shlex", "fnmatch", "glob", "posixpath", "calendar", "difflib",
                "heapq", "bisect", "argparse")
CHARS = "".join(chr(c) for c in range(32, 127)) + "\n"      # 96 symbols; anything else is a space
STEPS_PER_EPOCH = {"chars": 100, "shapes": 40}
TEST_SIZE = 1024


# ---------------------------------------------------------------------- chars
@functools.lru_cache(maxsize=1)
def _text() -> torch.Tensor:
    import importlib

    src = "\n".join(inspect.getsource(importlib.import_module(m)) for m in TEXT_MODULES)
    index = {c: i for i, c in enumerate(CHARS)}
    space = index[" "]
    return torch.tensor([index.get(c, space) for c in src], dtype=torch.int64)


def _windows(ids: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    idx = starts[:, None] + torch.arange(CONTEXT + 1)[None, :]
    w = ids[idx]
    return w[:, :CONTEXT], w[:, CONTEXT]


class CausalBlock(nn.Module):
    """A Transformer encoder layer under a causal mask (position t attends to positions <= t)."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(d_model, heads, 2 * d_model, dropout=0.0, batch_first=True)
        mask = torch.triu(torch.full((CONTEXT, CONTEXT), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One causal block."""
        return self.layer(x, src_mask=self.mask)


class CharModel(nn.Module):
    """Embedding + learned positions, ``depth`` causal Transformer layers, a head at every position."""

    def __init__(self, depth: int = 4, d_model: int = 48, heads: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(CHARS), d_model)
        self.pos = nn.Parameter(torch.randn(CONTEXT, d_model) * 0.02)
        self.blocks = nn.Sequential(*[CausalBlock(d_model, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, len(CHARS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, CONTEXT, chars]`` of the character after every position."""
        return self.head(self.norm(self.blocks(self.embed(x) + self.pos)))


def chars_model() -> nn.Module:
    """The char model (initial weights from torch's global generator, which ``pl.train`` seeds)."""
    return CharModel()


@functools.lru_cache(maxsize=64)
def chars_epoch(epoch: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``STEPS_PER_EPOCH['chars']`` minibatches of random windows from the first 90% of the text: inputs
    ``[BATCH, CONTEXT]`` and, at every position, the character after it ``[BATCH, CONTEXT]``."""
    ids = _text()
    cut = int(len(ids) * 0.9) - CONTEXT - 1
    g = torch.Generator().manual_seed(seed * 1000 + epoch)
    starts = torch.randint(0, cut, (STEPS_PER_EPOCH["chars"] * BATCH,), generator=g)
    w = ids[starts[:, None] + torch.arange(CONTEXT + 1)[None, :]]
    x, y = w[:, :CONTEXT], w[:, 1:]
    return [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(y), BATCH)]


@functools.lru_cache(maxsize=1)
def _chars_test() -> tuple[torch.Tensor, torch.Tensor]:
    ids = _text()
    lo = int(len(ids) * 0.9)
    starts = torch.linspace(lo, len(ids) - CONTEXT - 2, TEST_SIZE).long()
    return _windows(ids, starts)


# ---------------------------------------------------------------------- shapes
SIDE = 12


def _shape(kind: int, size: int) -> torch.Tensor:
    m = torch.zeros(size, size)
    if kind == 0:
        m[:] = 1
    elif kind == 1:
        m[0, :] = m[-1, :] = m[:, 0] = m[:, -1] = 1
    elif kind == 2:
        m[size // 2, :] = m[:, size // 2] = 1
    else:
        r = torch.arange(size)
        m[r, r] = m[r, size - 1 - r] = 1
    return m


def shapes_data(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` noisy images ``[n, 1, SIDE, SIDE]`` and their shape labels (0..3)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = torch.randn(n, 1, SIDE, SIDE, generator=g) * 0.35
    sizes = torch.randint(5, 9, (n,), generator=g)
    for i in range(n):
        s = int(sizes[i])
        r, c = (int(v) for v in torch.randint(0, SIDE - s + 1, (2,), generator=g))
        x[i, 0, r:r + s, c:c + s] += _shape(int(y[i]), s)
    return x, y


class Residual(nn.Module):
    """``relu(x + conv(relu(conv(x))))``."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(c, c, 3, padding=1), nn.Conv2d(c, c, 3, padding=1)
        self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One residual block."""
        return self.relu2(x + self.b(self.relu1(self.a(x))))


def shapes_model(channels: int = 8, blocks: int = 3) -> nn.Module:
    """Stem conv, ``blocks`` residual blocks, global average pool, linear head."""
    return nn.Sequential(nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
                         *[Residual(channels) for _ in range(blocks)],
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, 4))


@functools.lru_cache(maxsize=64)
def shapes_epoch(epoch: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``STEPS_PER_EPOCH['shapes']`` fresh minibatches (an endless generated training set)."""
    x, y = shapes_data(STEPS_PER_EPOCH["shapes"] * BATCH, 10_000 + seed * 100 + epoch)
    return [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(y), BATCH)]


@functools.lru_cache(maxsize=1)
def _shapes_test() -> tuple[torch.Tensor, torch.Tensor]:
    return shapes_data(TEST_SIZE, 1)


# ---------------------------------------------------------------------- common
def accuracy(task: str, net: nn.Module) -> float:
    """Test accuracy of ``net`` on ``task``'s held-out set."""
    x, y = _chars_test() if task == "chars" else _shapes_test()
    net.eval()
    with torch.no_grad():
        out = net(x)
        if out.dim() == 3:     # chars: the prediction after the whole window (the last position)
            out = out[:, -1]
        return float((out.argmax(1) == y).float().mean())


def linear_baseline(steps: int = 400) -> float:
    """Test accuracy of a linear classifier on the shapes' pixels (trained with Adam here)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(SIDE * SIDE, 4))
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    x, y = shapes_data(steps * BATCH // 4, 7)
    for i in range(steps):
        j = (i * BATCH) % len(y)
        opt.zero_grad()
        nn.functional.cross_entropy(net(x[j:j + BATCH]), y[j:j + BATCH]).backward()
        opt.step()
    return accuracy("shapes", net)


TASKS: dict[str, Any] = {"chars": (chars_model, chars_epoch), "shapes": (shapes_model, shapes_epoch)}


def epochs_data(task: str, epochs: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``epochs`` consecutive epochs of ``task`` as one list (a ``data`` callable for ``pl.train``;
    the epochs are made once per process and cached: the runtime calls ``data()`` more than once)."""
    fn = TASKS[task][1]
    return [b for e in range(epochs) for b in fn(e, seed)]

"""The example's data: scikit-learn's bundled 8x8 digits (no download), as fixed minibatches.

``batches()`` must return the same sequence every call: each worker process calls it and takes its
own microbatches of each minibatch.
"""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits


def batches(batch_size: int = 64, limit: int = 1280, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """``(images [B, 1, 8, 8], labels [B])`` minibatches of the first ``limit`` digits, shuffled."""
    digits = load_digits()
    x = torch.tensor(digits.data[:limit] / 16.0, dtype=torch.float32).view(-1, 1, 8, 8)
    y = torch.tensor(digits.target[:limit], dtype=torch.long)
    order = torch.from_numpy(np.random.default_rng(seed).permutation(len(y)))
    n = len(y) // batch_size * batch_size          # whole minibatches only
    return [(x[order[i:i + batch_size]], y[order[i:i + batch_size]]) for i in range(0, n, batch_size)]

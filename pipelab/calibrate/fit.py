"""The fits behind calibration: least squares relative to each time (small messages weigh as much as
large ones), clipped at 0, each returned with its relative RMS residual. The ring all-reduce is
``2 (p - 1) alpha + 2 (p - 1) / p * n / beta`` (Patarasuk and Yuan, JPDC 2009)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np


def _weighted_lstsq(a: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """``(x clipped at 0, relative RMS residual)`` of least squares of ``a @ x = y`` relative to ``y``."""
    if np.any(y <= 0) or not np.all(np.isfinite(y)):
        raise ValueError("timings must be finite and > 0 seconds")
    w = 1.0 / y
    x, *_ = np.linalg.lstsq(a * w[:, None], np.ones_like(y), rcond=None)
    x = np.clip(x, 0.0, None)
    pred = a @ x
    return x, float(np.sqrt(np.mean(((pred - y) / y) ** 2)))


def fit_alpha_beta(sizes: Sequence[float], times: Sequence[float]) -> tuple[float, float, float]:
    """``(alpha seconds, beta bytes/s, residual)`` of ``t = alpha + n / beta`` (Hockney; ``inf``: no
    bandwidth term)."""
    n = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    if n.shape != t.shape or len(set(n.tolist())) < 2:
        raise ValueError("fit_alpha_beta needs matching sizes and times over at least two distinct sizes")
    (alpha, inv_beta), res = _weighted_lstsq(np.stack([np.ones_like(n), n], axis=1), t)
    return float(alpha), (1.0 / inv_beta if inv_beta > 0 else math.inf), res


def fit_ring(samples: Sequence[tuple[float, int, float]]) -> tuple[float, float, float]:
    """``(alpha, beta, residual)`` of the ring all-reduce from ``(n bytes, p workers, t seconds)`` samples."""
    rows = [(2.0 * (p - 1), 2.0 * (p - 1) / p * n) for n, p, _ in samples if p > 1]
    if len(set(rows)) < 2:
        raise ValueError("fit_ring needs samples of at least two distinct sizes or group sizes (p > 1)")
    t = np.array([s[2] for s in samples if s[1] > 1], dtype=np.float64)
    (alpha, inv_beta), res = _weighted_lstsq(np.array(rows), t)
    return float(alpha), (1.0 / inv_beta if inv_beta > 0 else math.inf), res


def fit_step(rows: Sequence[tuple[float, float, float]]) -> tuple[float, float, float, float]:
    """``(a, b, c, residual)`` of an optimizer step ``t = a + b * bytes + c * tensors`` from
    ``(bytes, tensors, t seconds)`` rows (torch's CPU optimizers loop over tensors)."""
    x = np.asarray([(1.0, float(n), float(k)) for n, k, _ in rows], dtype=np.float64)
    y = np.asarray([t for _, _, t in rows], dtype=np.float64)
    if len(rows) < 3 or np.linalg.matrix_rank(x) < 3:
        raise ValueError("fit_step needs rows over at least two parameter sizes and two tensor counts "
                         "(not all on one line)")
    (a, b, c), res = _weighted_lstsq(x, y)
    return float(a), float(b), float(c), res


def spread(values: Sequence[float]) -> float:
    """``(max - min) / median`` of repeated measurements of one figure (0 for fewer than two)."""
    vs = [float(v) for v in values if math.isfinite(v)]
    if len(vs) < 2:
        return 0.0
    med = statistics.median(vs)
    return (max(vs) - min(vs)) / med if med > 0 else 0.0

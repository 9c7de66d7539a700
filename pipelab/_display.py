"""How records show themselves: ``repr`` is the first lines of ``describe()``, ``_repr_html_`` all of it
(a record's field dump can run to megabytes)."""

from __future__ import annotations

import html

#: the most lines ``repr`` shows; the rest is summarized as a count
REPR_LINES = 12


def short(text: str, lines: int = REPR_LINES) -> str:
    """``text`` cut to ``lines`` lines, the rest counted."""
    rows = text.splitlines()
    if len(rows) <= lines:
        return text
    return "\n".join([*rows[:lines], f"... ({len(rows) - lines} more lines; .describe() has them all)"])


def html_pre(text: str) -> str:
    """``text`` as an HTML ``<pre>`` block, escaped."""
    return f"<pre style='white-space: pre-wrap'>{html.escape(text)}</pre>"


class Described:
    """Mixin: ``repr`` and ``_repr_html_`` from ``describe()``; dataclasses using it pass ``repr=False``."""

    def describe(self) -> str:  # pragma: no cover - every user defines it
        raise NotImplementedError

    def __repr__(self) -> str:
        return short(self.describe())

    def _repr_html_(self) -> str:
        return html_pre(self.describe())

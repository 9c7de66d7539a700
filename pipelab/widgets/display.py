"""Showing a figure with or without a live front end.

A live front end is JupyterLab or Notebook (jupyter_server sets ``JPY_SESSION_NAME`` for the kernels it
starts; papermill and nbconvert do not) with ``anywidget`` installed. Without one, every widget shows
static HTML with plotly.js inlined once per kernel, so a report renders offline at a sensible size.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import plotly.graph_objects as go

from pipelab.views import to_html

_PLOTLYJS_FLAG = "_pipelab_plotlyjs_included"


def live_frontend() -> bool:
    """True when a JupyterLab/Notebook front end runs this kernel and FigureWidget can render."""
    return "JPY_SESSION_NAME" in os.environ and importlib.util.find_spec("anywidget") is not None


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython ships with ipykernel
        return None
    return get_ipython()


def static_html(fig: go.Figure) -> str:
    """HTML for a report: plotly.js inlined on the first figure of this kernel (always outside IPython)."""
    shell = _shell()
    first = shell is None or not getattr(shell, _PLOTLYJS_FLAG, False)
    if shell is not None:
        setattr(shell, _PLOTLYJS_FLAG, True)
    return to_html(fig, include_plotlyjs=bool(first))


def show(fig: go.Figure, *, live: bool | None = None) -> None:
    """Display a fixed figure: plotly's MIME bundle with a live front end (no widget comm), else HTML."""
    import plotly.io as pio
    from IPython.display import HTML, display

    if live if live is not None else live_frontend():
        pio.show(fig, renderer="plotly_mimetype")
    else:
        display(HTML(static_html(fig)))


class Displayable:
    """Shared display logic: the widget box when live, else :meth:`static_figures` as offline HTML."""

    live: bool
    widget: Any

    def static_figures(self) -> list[go.Figure]:
        """The figures to show without a live front end."""
        raise NotImplementedError

    def _ipython_display_(self) -> None:
        from IPython.display import HTML, display

        if self.live:
            display(self.widget)
        else:
            for text in self.static_text():
                display(HTML(text))
            for fig in self.static_figures():
                display(HTML(static_html(fig)))

    def static_text(self) -> list[str]:
        """HTML lines shown above the static figures."""
        return []


def ipywidgets() -> Any:
    """The ``ipywidgets`` module, imported only when a live widget is built."""
    import ipywidgets as w

    return w

"""Result files and figures of the reproductions: CSV, Markdown, SVG, plotly, and the merged HTML report."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelab._io import atomic_write_text

#: the checkout's root, which holds ``pipelab/`` and ``reproductions/``
_ROOT = Path(__file__).resolve().parents[2]

if TYPE_CHECKING:
    import pandas as pd
    import plotly.graph_objects as go





def show_figure(fig: go.Figure, report: bool) -> None:
    """Show ``fig`` live in JupyterLab, or, in a report (``report=True``, under the driver), as HTML
    whose plotly.js the driver's report adds once."""
    from IPython.display import HTML, display  # only inside a notebook kernel

    if report:
        display(HTML(fig.to_html(full_html=False, include_plotlyjs=False)))
    else:
        fig.show()


def write_table(df: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write a DataFrame as CSV (atomically)."""
    return atomic_write_text(path, df.to_csv(index=False))


def write_rows(path: str | os.PathLike[str], rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write dict rows as CSV (atomically), the columns those of the first row."""
    import csv
    import io

    if not rows:
        raise ValueError(f"{path}: no rows to write")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    return atomic_write_text(path, buf.getvalue())


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write a text file (atomically): a result table, an SVG chart."""
    return atomic_write_text(path, text)


def curves_figure(df: pd.DataFrame, *, x: str, y: str, color: str, title: str = "") -> go.Figure:
    """One line per ``color`` value of ``y`` against ``x`` (plotly)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for key, part in df.groupby(color, sort=False):
        fig.add_trace(go.Scatter(x=part[x], y=part[y], mode="lines+markers", name=str(key)))
    fig.update_layout(title=title, xaxis_title=x, yaxis_title=y, template="plotly_white", height=420)
    return fig


def bar_figure(df: pd.DataFrame, *, x: str, y: str, title: str = "") -> go.Figure:
    """Bars of ``y`` per ``x`` (plotly)."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=df[x].astype(str), y=df[y], text=df[y], textposition="outside"))
    fig.update_layout(title=title, yaxis_title=y, template="plotly_white", height=380)
    return fig


_SVG_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf")


def svg_curves(df: pd.DataFrame, *, x: str, y: str, color: str, title: str = "",
               width: int = 640, height: int = 400) -> str:
    """A self-contained SVG line chart (no plotting library, renders anywhere offline)."""
    from html import escape

    left, right, top, bottom = 60, 190, 36, 44
    xs = [float(v) for v in df[x]]
    ys = [float(v) for v in df[y]]
    if not xs:
        raise ValueError("svg_curves needs at least one row")
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    pad = (y1 - y0) * 0.05 or 0.05
    y0, y1 = y0 - pad, y1 + pad
    pw, ph = width - left - right, height - top - bottom

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + (y1 - v) / (y1 - y0) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for i in range(5):
        v = y0 + (y1 - y0) * i / 4
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{py(v):.1f}" y2="{py(v):.1f}" stroke="#eee"/>'
                   f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:.3g}</text>')
    for v in sorted(set(xs)):
        out.append(f'<text x="{px(v):.1f}" y="{top + ph + 16}" text-anchor="middle">{v:g}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 8}" text-anchor="middle">{escape(x)}</text>')
    out.append(f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" '
               f'text-anchor="middle">{escape(y)}</text>')
    for i, (key, part) in enumerate(df.groupby(color, sort=False)):
        c = _SVG_COLORS[i % len(_SVG_COLORS)]
        pts = " ".join(f"{px(float(a)):.1f},{py(float(b)):.1f}" for a, b in zip(part[x], part[y]))
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>')
        ly = top + 14 + 18 * i
        out.append(
            f'<line x1="{left + pw + 12}" x2="{left + pw + 32}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{c}" stroke-width="3"/><text x="{left + pw + 38}" y="{ly}">{escape(str(key))}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def svg_heatmap(grid: Sequence[Sequence[float]], *, xs: Sequence[Any], ys: Sequence[Any], xlabel: str,
                ylabel: str, title: str = "", mark: tuple[int, int] | None = None, vmax: float | None = None,
                cell: int = 64) -> str:
    """A self-contained SVG heatmap: ``grid[i][j]`` at row ``ys[i]``, column ``xs[j]``, its value
    written in the cell; ``mark`` = (i, j) outlines one cell (e.g. the default parameters)."""
    from html import escape

    if not grid or any(len(r) != len(xs) for r in grid) or len(grid) != len(ys):
        raise ValueError("svg_heatmap needs a len(ys) x len(xs) grid")
    top_v = vmax if vmax is not None else max(max(r) for r in grid) or 1.0
    left, top = 90, 40
    width, height = left + cell * len(xs) + 20, top + cell * len(ys) + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">{escape(title)}</text>']
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            f = max(0.0, min(1.0, float(v) / top_v))
            shade = f"rgb({int(255 - 200 * f)},{int(255 - 120 * f)},{int(255 - 40 * f)})"
            x, y = left + j * cell, top + i * cell
            out.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{shade}" stroke="#ccc"/>'
                       f'<text x="{x + cell / 2}" y="{y + cell / 2 + 5}" text-anchor="middle" '
                       f'font-size="16">{float(v):g}</text>')
    if mark is not None:
        i, j = mark
        out.append(f'<rect x="{left + j * cell + 2}" y="{top + i * cell + 2}" width="{cell - 4}" '
                   f'height="{cell - 4}" fill="none" stroke="black" stroke-width="3"/>')
    for j, v in enumerate(xs):
        out.append(f'<text x="{left + j * cell + cell / 2}" y="{top + len(ys) * cell + 16}" '
                   f'text-anchor="middle">{escape(str(v))}</text>')
    for i, v in enumerate(ys):
        out.append(f'<text x="{left - 8}" y="{top + i * cell + cell / 2 + 4}" text-anchor="end">'
                   f'{escape(str(v))}</text>')
    out.append(f'<text x="{left + cell * len(xs) / 2}" y="{height - 10}" text-anchor="middle">'
               f'{escape(xlabel)}</text>')
    out.append(f'<text x="14" y="{top + cell * len(ys) / 2}" transform="rotate(-90 14 '
               f'{top + cell * len(ys) / 2})" text-anchor="middle">{escape(ylabel)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def markdown_table(df: pd.DataFrame) -> str:
    """A pipe table without the optional ``tabulate`` dependency."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if math.isnan(v) else f"{v:g}"
        return "" if v is None else str(v)

    head = "| " + " | ".join(str(c) for c in df.columns) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def build_report(sections: Sequence[tuple[str, Path]], intro_md: str, path: Path, *, title: str) -> Path:
    """Merge executed notebooks into one offline HTML report, with plotly.js included once.

    The notebooks ran with ``report=True``, so their figures are HTML that expects a global ``Plotly``;
    the first cell of the merged notebook defines it. Code is hidden; outputs are kept.
    """
    import nbformat
    from nbconvert import HTMLExporter
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output
    from plotly.offline import get_plotlyjs

    # plotly.js registers itself as an AMD module when require.js is present, and then ``window.Plotly``
    # stays undefined: hide ``define`` while it loads.
    js = ("<script>var __pl_define = window.define; window.define = undefined;</script>\n"
          f"<script type=\"text/javascript\">{get_plotlyjs()}</script>\n"
          "<script>window.define = __pl_define;</script>")
    lib = new_code_cell("")
    lib.outputs = [new_output("display_data", data={"text/html": js})]
    cells = [new_markdown_cell(intro_md), lib]
    for heading, executed in sections:
        cells.append(new_markdown_cell(f"## {heading}"))
        run = nbformat.read(str(executed), as_version=4)
        for c in run.cells:
            tags = c.get("metadata", {}).get("tags", [])
            if (
                c.cell_type == "code"
                and "parameters" not in tags
                and "injected-parameters" not in tags
                and c.outputs
            ):
                cells.append(c)
    for i, c in enumerate(cells):  # cells come from several notebooks: make their ids unique again
        c.id = f"report-{i}"
    nb = new_notebook(cells=cells)
    nb.metadata["title"] = title
    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    exporter.require_js_url = "data:application/javascript,"  # nothing to fetch: the report works offline
    body, _ = exporter.from_notebook_node(nb)
    return atomic_write_text(path, body)


def run_notebook(notebook: Path, executed: Path, parameters: Mapping[str, Any], *, cwd: Path,
                 timeout: int = 900) -> Path:
    """Execute ``notebook`` with papermill (``parameters`` injected after its ``parameters`` cell).

    Raises ``RuntimeError`` naming the notebook, the failing cell's error and the executed copy to open.
    """
    import papermill as pm
    from traitlets.config import Config

    executed.parent.mkdir(parents=True, exist_ok=True)
    env_before = os.environ.get("OMP_NUM_THREADS")
    path_before = os.environ.get("PYTHONPATH")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # the kernel imports ``reproductions.*`` from the checkout's root
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), path_before) if p)
    try:
        # the kernel talks to us over local IPC sockets in a private folder: no TCP port, so no
        # "Kernel is running over TCP without encryption" warning per notebook, and nothing in ``cwd``
        with tempfile.TemporaryDirectory(prefix="pipelab-kernel-") as sockets:
            ipc = Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets, "kernel")}})
            pm.execute_notebook(str(notebook), str(executed), parameters=dict(parameters), cwd=str(cwd),
                                kernel_name="python3", progress_bar=False, log_output=False,
                                execution_timeout=timeout, config=ipc)
    except pm.PapermillExecutionError as exc:
        raise RuntimeError(f"{notebook.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}\n"
                           f"open {executed} to see the traceback") from None
    finally:
        if env_before is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        if path_before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = path_before
    return executed

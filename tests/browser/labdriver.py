"""Drive a real JupyterLab in headless Chromium: start a private server, open a notebook, probe the DOM.

Used by ``test_browser.py``. The server runs on a free 127.0.0.1 port with a random token, in a
temporary HOME/settings/runtime folder (nothing of the user's Jupyter set-up leaks in or out), with
``windowingMode: none`` so every cell stays in the DOM (Lab otherwise virtualizes off-screen cells and
a probe would miss their outputs). The server is stopped through its API, or by its own PID.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# One record per code cell: its "# [name]" tag, prompt, plots (title, bars, heatmap images), output text.
# A bar box is a drawn path; the Gantt's legend-only entries draw an empty one ("M0,0Z"), not counted.
PROBE = r"""() => {
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(c => {
    const src = (c.querySelector('.jp-InputArea-editor') || {}).textContent || '';
    const m = src.match(/^\s*# \[(\w+)\]/);
    const prompt = ((c.querySelector('.jp-InputArea-prompt') || {}).textContent || '').trim();
    const plots = [...c.querySelectorAll('.jp-OutputArea .js-plotly-plot')].map(p => ({
      title: ((p.querySelector('.gtitle') || {}).textContent || ''),
      bars: [...p.querySelectorAll('.barlayer .point path')].filter(x => x.getAttribute('d') !== 'M0,0Z' && !x.closest('.rangeslider-container')).length,
      images: [...p.querySelectorAll('.heatmaplayer image')].filter(x => !x.closest('.rangeslider-container')).length}));
    const out = c.querySelector('.jp-OutputArea');
    return {name: m ? m[1] : '', prompt, plots, text: out ? out.innerText.slice(0, 3000) : ''};
  });
  return {cells,
          errors: document.querySelectorAll('.jp-Notebook [data-mime-type="application/vnd.jupyter.error"]').length,
          widget_errors: (document.body.innerText.match(
             /Error displaying widget|Failed to load model class|Error creating (view|widget)|Click to show javascript error/g)
             || []).length};
}"""

# (Bars and heatmap images count the main plot only: a range slider draws a second, small copy.)
# Started in the page with a list of cells (a "# [tag]" name or a code-cell index): every 100 ms it
# records, per cell, the prompt, drawn bar boxes, plot divs and heatmap images, with the page's clock,
# into window.__samples. Sampling inside the page does not depend on round trips from the test
# process, which a loaded machine can stall for seconds. Read it back with
# page.evaluate("window.__samples") -> [{t, cells: {key: {prompt, bars, plots, images}}}].
SAMPLER = r"""(keys) => {
  window.__samples = [];
  const find = k => { const cs = [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')];
    return typeof k === 'number' ? cs[k] : cs.find(
      c => ((c.querySelector('.jp-InputArea-editor') || {}).textContent || '').includes('# [' + k + ']')); };
  if (window.__sampler) clearInterval(window.__sampler);
  window.__sampler = setInterval(() => {
    const cells = {};
    for (const k of keys) {
      const c = find(k);
      cells[k] = c ? {prompt: ((c.querySelector('.jp-InputArea-prompt') || {}).textContent || '').trim(),
                      bars: [...c.querySelectorAll('.js-plotly-plot .barlayer .point path')].filter(
                        x => x.getAttribute('d') !== 'M0,0Z' && !x.closest('.rangeslider-container')).length,
                      plots: c.querySelectorAll('.js-plotly-plot').length,
                      images: [...c.querySelectorAll('.js-plotly-plot .heatmaplayer image')].filter(
                        x => !x.closest('.rangeslider-container')).length}
                   : {prompt: '', bars: 0, plots: 0, images: 0};
    }
    window.__samples.push({t: performance.now(), cells});
  }, 100);
}"""


# The same for a static HTML report (nbconvert): plots in document order.
REPORT_PROBE = r"""() => ({
  plots: [...document.querySelectorAll('.js-plotly-plot')].map(p => ({
      title: ((p.querySelector('.gtitle') || {}).textContent || ''),
      bars: [...p.querySelectorAll('.barlayer .point path')].filter(x => x.getAttribute('d') !== 'M0,0Z' && !x.closest('.rangeslider-container')).length,
      images: [...p.querySelectorAll('.heatmaplayer image')].filter(x => !x.closest('.rangeslider-container')).length})),
  text: document.body.innerText.slice(0, 20000)})"""


def find_chromium() -> str | None:
    """Path of a Chromium binary ($CHROMIUM, /usr/bin/chromium, /usr/bin/chromium-browser) or None."""
    for c in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def hermetic_env(home: Path, extra_path: Path) -> dict[str, str]:
    """Environment for the server and its kernels: private HOME and Jupyter dirs, one thread per process."""
    env = {**os.environ, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
           "IPYTHONDIR": str(home / ".ipython"), "XDG_CONFIG_HOME": str(home / ".config"),
           "XDG_CACHE_HOME": str(home / ".cache"), "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(extra_path), os.environ.get("PYTHONPATH", "")) if p)
    env.pop("JPY_SESSION_NAME", None)
    return env


class Lab:
    """A running JupyterLab server (see :func:`jupyter_lab`)."""

    def __init__(self, base: str, token: str, root: Path, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.base, self.token, self.root, self.proc, self.log = base, token, root, proc, log

    def api(self, path: str, method: str = "GET") -> Any:
        """Call the server's REST API."""
        req = urllib.request.Request(f"{self.base}{path}", method=method,
                                     headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
            return json.loads(body) if body else None

    def kernel_state(self) -> str:
        """Execution state of the (single) kernel: idle, busy, starting, none or unknown."""
        try:
            ks = self.api("/api/kernels")
            return str(ks[0]["execution_state"]) if ks else "none"
        except Exception:  # the API answers 500 while a kernel starts
            return "unknown"

    def url(self, notebook: str) -> str:
        """The Lab URL that opens ``notebook``."""
        return f"{self.base}/lab/tree/{notebook}?token={self.token}"


@contextmanager
def jupyter_lab(root: Path, work: Path, *, start_timeout: float = 90.0) -> Iterator[Lab]:
    """Start ``python -m jupyterlab`` serving ``root``; stop it (API shutdown, then its PID) on exit."""
    home, settings = work / "home", work / "settings"
    home.mkdir(parents=True, exist_ok=True)
    for ext, plugin, val in [
        ("notebook-extension", "tracker", {"windowingMode": "none"}),
        ("apputils-extension", "notification", {"fetchNews": "false", "checkForUpdates": False}),
    ]:
        d = settings / "@jupyterlab" / ext
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{plugin}.jupyterlab-settings").write_text(json.dumps(val))
    port, token = free_port(), secrets.token_hex(16)
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.news_url=None", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
           f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={work / 'ws'}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = work / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=hermetic_env(home, root), cwd=root)
        lab = Lab(f"http://127.0.0.1:{port}", token, root, proc, log_path)
        try:
            t0 = time.time()
            while True:
                try:
                    lab.api("/api/status")
                    break
                except Exception:
                    if proc.poll() is not None or time.time() - t0 > start_timeout:
                        raise RuntimeError(
                            f"jupyter lab did not start; log:\n{log_path.read_text()[-3000:]}"
                        ) from None
                    time.sleep(0.3)
            yield lab
        finally:
            try:
                lab.api("/api/shutdown", method="POST")
                proc.wait(timeout=20)
            except Exception:
                proc.terminate()            # only the server we started (its kernels die with it)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()


def copy_inputs(files: list[Path], root: Path) -> None:
    """Copy the notebook and its helper modules into the server's root (never run the stored copy)."""
    root.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, root / f.name)


def cell(sample: dict[str, Any], name: str) -> dict[str, Any]:
    """The probe record of the cell tagged ``# [name]``."""
    for c in sample["cells"]:
        if c["name"] == name:
            return c
    raise KeyError(f"no cell tagged [{name}] in the page (cells: {[c['name'] for c in sample['cells']]})")


def finished(prompt: str) -> bool:
    """Whether a cell prompt shows a finished execution, e.g. ``[3]:``."""
    return re.fullmatch(r"\[\d+\]:", prompt) is not None


# Per code cell, per plotly chart: the page boxes (left, top, right, bottom) of its title, legend and plot
# area, its x range, whether it has a range slider, and the microbatches of the boxes inside that range.
GEOMETRY = r"""() => [...document.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(c =>
  [...c.querySelectorAll('.js-plotly-plot')].map(gd => {
    const box = el => { if (!el) return null; const b = el.getBoundingClientRect();
                        return [b.left, b.top, b.right, b.bottom]; };
    const full = gd._fullLayout || {};
    const xr = (full.xaxis || {}).range || null;
    const mbs = new Set();
    for (const t of (gd._fullData || [])) {
      if (t.type !== 'bar' || !t.customdata || t.name === 'transfer' || !xr) continue;
      for (let j = 0; j < t.customdata.length; j++) {
        const b = Number(t.base[j]), x = Number(t.x[j]);
        if (b < xr[1] && b + x > xr[0]) mbs.add(Number(t.customdata[j][1]));
      }
    }
    return {title: box(gd.querySelector('.gtitle')), legend: box(gd.querySelector('.legend .bg')),
            plot: box(gd.querySelector('.nsewdrag')), range: xr,
            slider: !!gd.querySelector('.rangeslider-container'),
            titleText: (gd.querySelector('.gtitle') || {}).textContent || '',
            microbatches: [...mbs].sort((a, b) => a - b)};
  }))"""


def overlaps(a: list[float] | None, b: list[float] | None) -> bool:
    """Whether two page boxes (left, top, right, bottom) share any area (touching edges do not)."""
    if a is None or b is None:
        return False
    return a[0] < b[2] - 0.5 and b[0] < a[2] - 0.5 and a[1] < b[3] - 0.5 and b[1] < a[3] - 0.5


def check_legend_clear(plot: dict[str, Any], where: str) -> None:
    """A chart's legend box intersects neither its title's box nor its plot area."""
    assert plot["plot"] is not None, f"{where}: no plot area drawn"
    assert not overlaps(plot["legend"], plot["title"]), \
        f"{where}: the legend {plot['legend']} covers the title {plot['title']} ({plot['titleText'][:60]!r})"
    assert not overlaps(plot["legend"], plot["plot"]), \
        f"{where}: the legend {plot['legend']} covers the plot area {plot['plot']}"

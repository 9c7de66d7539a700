"""The papers' reproductions: ``pipelab reproduce`` / ``make reproduce``, and their notebooks' helpers.

Each claim lives in a folder of ``reproductions/`` with a README (claim, set-up, the paper's numbers),
a papermill notebook and the results it wrote. :func:`main` runs every notebook at sizes that fit a
laptop CPU in a few minutes (tqdm progress bar), writes the tables and reports, and prints the
PipeDream Table 1 comparison at the end.

The notebooks stay thin: what they compute is here, typed and tested, and importable by worker
processes (which a function defined inside a notebook is not). Modules:

- :mod:`.table1` — PipeDream Table 1: the paper's rows, ours, the cost-model terms behind them;
- :mod:`.measure` — Table 1's measure mode: reduced models, this machine's bandwidth, real runs;
- :mod:`.stashing` — accuracy per epoch of the weight policies on the digits CNN;
- :mod:`.hetpipe` — HetPipe's virtual workers and the WSP timeline;
- :mod:`.report` — CSV, Markdown, SVG and plotly output, the merged offline HTML report;
- :mod:`.driver` — the papermill driver (:func:`main`) and the quickstart.
"""

from __future__ import annotations

from pipelab.reproduce.driver import (
                                       REPRODUCTIONS,
                                       Job,
                                       collect_table1,
                                       main,
                                       quickstart,
                                       run_jobs,
                                       table1_jobs,
                                       table1_results_md,
)
from pipelab.reproduce.hetpipe import hetpipe_emulated, hetpipe_simulated, rebatch, wsp_makespan
from pipelab.reproduce.measure import (
                                       cross_entropy,
                                       gloo_loopback,
                                       gloo_loopback_bandwidth,
                                       measure_row,
                                       optimizer_bandwidth,
                                       paper_model,
                                       random_batches,
                                       reduced_model,
                                       sample_input,
)
from pipelab.reproduce.report import (
                                       bar_figure,
                                       build_report,
                                       curves_figure,
                                       markdown_table,
                                       run_notebook,
                                       show_figure,
                                       svg_curves,
                                       write_table,
                                       write_text,
)
from pipelab.reproduce.stashing import (
                                       digits_accuracy,
                                       digits_epoch,
                                       digits_epochs,
                                       digits_model,
                                       mean_over_seeds,
                                       parse_method,
                                       stash_experiment,
                                       stash_lr_sweep,
                                       stash_plan,
                                       stash_summary,
                                       stash_verdict,
)
from pipelab.reproduce.table1 import (
                                       TABLE1,
                                       PaperRow,
                                       config_shape,
                                       cost_terms,
                                       paper_config_plan,
                                     paper_row,
                                       simulate_plan,
                                       table1_markdown,
                                       table1_row,
                                       write_row,
)

__all__ = [
    "REPRODUCTIONS",
    "TABLE1",
    "Job",
    "PaperRow",
    "bar_figure",
    "build_report",
    "collect_table1",
    "config_shape",
    "cost_terms",
    "cross_entropy",
    "curves_figure",
    "digits_accuracy",
    "digits_epoch",
    "digits_epochs",
    "digits_model",
    "gloo_loopback",
    "gloo_loopback_bandwidth",
    "hetpipe_emulated",
    "hetpipe_simulated",
    "main",
    "markdown_table",
    "mean_over_seeds",
    "measure_row",
    "optimizer_bandwidth",
    "paper_config_plan",
    "paper_model",
    "paper_row",
    "parse_method",
    "quickstart",
    "random_batches",
    "rebatch",
    "reduced_model",
    "run_jobs",
    "run_notebook",
    "show_figure",
    "sample_input",
    "simulate_plan",
    "stash_experiment",
    "stash_lr_sweep",
    "stash_plan",
    "stash_summary",
    "stash_verdict",
    "svg_curves",
    "table1_jobs",
    "table1_markdown",
    "table1_results_md",
    "table1_row",
    "wsp_makespan",
    "write_row",
    "write_table",
    "write_text",
]

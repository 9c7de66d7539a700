"""The planner's measured confirmation (pipelab.planner.confirmation): the choice rule against hand-worked
cases, the shortlist, and a whole confirmation on the reference executor."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import pipelab as pl
from pipelab.planner.confirmation import choose, shortlist, steps_for
from reproductions.sim_accuracy import accuracy


def test_choose_needs_a_majority_of_rounds_and_a_median_above_one() -> None:
    # row 1 wins 2 of 3 rounds (median 1.10), row 2 wins 1 of 3 despite a huge round: row 1
    assert choose({0: [1, 1, 1], 1: [1.2, 0.9, 1.1], 2: [3.0, 0.8, 0.9]}, 0) == 1
    # nobody wins a majority: the default stays
    assert choose({0: [1, 1, 1], 1: [1.2, 0.9, 0.95], 2: [0.99, 0.98, 1.5]}, 0) == 0
    # two winners: the higher median; a tie keeps the first listed
    assert choose({0: [1, 1, 1], 3: [1.1, 1.2, 1.3], 4: [1.5, 1.4, 0.9]}, 0) == 4
    assert choose({0: [1, 1, 1], 3: [1.2, 1.2, 1.2], 4: [1.2, 1.2, 1.2]}, 0) == 3
    # exactly half the rounds is not a majority; a candidate that never ran is skipped
    assert choose({0: [1, 1], 1: [1.5, 0.9], 2: []}, 0) == 0


def test_steps_for_is_about_the_asked_steady_state() -> None:
    assert steps_for(6400.0, 64, 1.0) == 100 + 25 + 4
    assert steps_for(10.0, 64, 0.5) == 16              # at least 16
    assert steps_for(1e9, 1, 1.0) == 2000               # at most 2,000
    with pytest.raises(ValueError, match="seconds"):
        steps_for(100.0, 8, 0.0)


@pytest.fixture(scope="module")
def cnn_table() -> tuple[pl.planner.PlanTable, pl.Profile]:
    torch.manual_seed(0)
    model_fn, data_fn, loss_fn, batch = accuracy.MODELS["cnn"]
    x, y = data_fn(batch)[0]
    prof = pl.profile(model_fn(), x, loss_fn=loss_fn, target=y, progress=False, repeats=2, model_name="cnn")
    table = pl.plan(prof, pl.Cluster.flat(2), methods=["1f1b-flush", "gpipe", "pipedream", "dp"],
                    compression=(None,), recompute=(False,), allreduce_overlap="none")
    return table, prof


def test_shortlist_starts_with_the_default_and_names_each_row_once(cnn_table) -> None:
    table, _ = cnn_table
    rows = shortlist(table, top=2)
    assert rows[0] == (int(table.default.name), "default")
    assert len({r for r, _ in rows}) == len(rows)
    assert int(table.fastest.name) in {r for r, _ in rows}
    assert all(table.table.loc[r, "fits"] and table.table.loc[r, "status"] == "simulated" for r, _ in rows)
    with pytest.raises(ValueError, match="top"):
        shortlist(table, top=-1)


def test_confirm_measures_the_shortlist_and_chooses_one(cnn_table) -> None:
    table, _ = cnn_table
    model_fn, data_fn, loss_fn, batch = accuracy.MODELS["cnn"]
    got = pl.planner.confirm(table, model_fn, functools.partial(data_fn, batch), loss_fn, accuracy.sgd,
                             rounds=3, steps=8, backend="local", progress=False)
    t = got.table
    assert t["chosen"].sum() == 1 and got.row == int(got.best["row"])
    assert t.iloc[0]["role"] == "default" and t.iloc[0]["vs_default"] == 1.0 and t.iloc[0]["wins"] == 0
    assert (t["status"] == "measured").all() and (t["rounds"] == 3).all() and (t["measured"] > 0).all()
    assert all(math.isclose(e, (p - m) / m) for e, p, m in zip(t["error"], t["predicted"], t["measured"]))
    # the choice is the rule applied to the measured per-round ratios
    base = t.iloc[0]["per_round"]
    paired = {int(r): [x / d for x, d in zip(xs, base)] for r, xs in zip(t["row"], t["per_round"])}
    assert got.row == choose(paired, int(t.iloc[0]["row"]))
    assert "measured side by side, 3 rounds" in got.describe()


def test_confirm_refuses_a_row_it_cannot_run(cnn_table) -> None:
    table, _ = cnn_table
    model_fn, data_fn, loss_fn, batch = accuracy.MODELS["cnn"]
    data = functools.partial(data_fn, batch)
    with pytest.raises(ValueError, match="not in the plan table"):
        pl.planner.confirm(table, model_fn, data, loss_fn, accuracy.sgd, rows=[10**6], backend="local")
    skipped = table.table.index[table.table["status"] != "simulated"]
    if len(skipped):
        with pytest.raises(ValueError, match="was not simulated or does not fit"):
            pl.planner.confirm(table, model_fn, data, loss_fn, accuracy.sgd, rows=[int(skipped[0])],
                               backend="local")
    with pytest.raises(ValueError, match="rounds"):
        pl.planner.confirm(table, model_fn, data, loss_fn, accuracy.sgd, rounds=0, backend="local")

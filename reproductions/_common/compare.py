"""How one run of a reproduction compares with its committed reference results, table by table.

A run writes its tables (CSV) into a run folder; the committed references are the same files in the
reproduction's own folder. For each table both hold, rows are matched on their text and whole-number
columns (the configuration: method, model, epoch, seed, ...), and each other numeric column shared by
both is compared on
the matched rows: the largest relative change, where it is, and how many rows each side has (a run
at the defaults' stated subset has fewer rows than the full references). Nothing is judged right or
wrong here: measured figures move with the machine and its load; the lines say how much they moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

#: changes below this relative size are reported as "the same"
SAME = 1e-9


@dataclass(frozen=True)
class TableChange:
    """One table of a run against its reference: matched rows and the largest numeric change."""

    name: str
    rows_run: int
    rows_reference: int
    rows_matched: int
    largest: float                 # the largest relative change over matched rows (0: identical); NaN: none
    column: str = ""               # where the largest change is
    row: str = ""

    def describe(self) -> str:
        """One line for the run's output."""
        if self.rows_matched == 0:
            return (f"{self.name}: no row of this run ({self.rows_run}) matches one of the reference's "
                    f"({self.rows_reference})")
        rows = (f"{self.rows_matched} rows" if self.rows_run == self.rows_reference == self.rows_matched
                else f"{self.rows_matched} rows matched (this run {self.rows_run}, reference "
                     f"{self.rows_reference})")
        if math.isnan(self.largest):
            return f"{self.name}: {rows}, no numeric column in common"
        if self.largest <= SAME:
            return f"{self.name}: {rows}, the same as the reference"
        return (f"{self.name}: {rows}, largest change {self.largest:.1%} in {self.column} "
                f"({self.row})")


def _key(df: pd.DataFrame, columns: list[str]) -> pd.Series:
    if not columns:
        return pd.Series([f"row {i}" for i in range(len(df))], index=df.index)
    # each value through str() itself: a missing text value is a float NaN in pandas' string columns
    return pd.Series([" / ".join(str(v) for v in row) for row in df[columns].itertuples(index=False)],
                     index=df.index, dtype=object)


def compare_table(run: pd.DataFrame, reference: pd.DataFrame, name: str) -> TableChange:
    """Match ``run``'s rows with ``reference``'s on their shared text columns and find the largest
    relative numeric change (``|run - ref| / max(|ref|, 1e-12)``) over shared numeric columns."""
    shared = [c for c in run.columns if c in reference.columns]

    def keyed(c: str) -> bool:   # text or whole numbers on both sides: a configuration (method, epoch, seed)
        return all(not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_integer_dtype(df[c])
                   for df in (run, reference))
    text = [c for c in shared if keyed(c)]
    numeric = [c for c in shared if c not in text and pd.api.types.is_numeric_dtype(run[c])
               and pd.api.types.is_numeric_dtype(reference[c])]
    a = run.assign(_key=_key(run, text)).drop_duplicates("_key").set_index("_key")
    b = reference.assign(_key=_key(reference, text)).drop_duplicates("_key").set_index("_key")
    matched = [k for k in a.index if k in b.index]
    largest, where_col, where_row = (math.nan if not numeric else 0.0), "", ""
    for col in numeric:
        for k in matched:
            x, y = a.at[k, col], b.at[k, col]
            if pd.isna(x) and pd.isna(y):
                continue
            if pd.isna(x) or pd.isna(y):
                change = math.inf
            else:
                change = abs(float(x) - float(y)) / max(abs(float(y)), 1e-12)
            if change > largest:
                largest, where_col, where_row = change, col, str(k)
    return TableChange(name, len(run), len(reference), len(matched), largest, where_col, where_row)


def compare_folder(run_dir: Path, reference_dir: Path) -> list[str]:
    """One line per CSV table of ``run_dir`` (recursively) against the same path under ``reference_dir``;
    tables the reference lacks, and reference tables this run did not write, are named too."""
    lines = []
    run_tables = sorted(p.relative_to(run_dir) for p in run_dir.rglob("*.csv"))
    for rel in run_tables:
        ref = reference_dir / rel
        if not ref.is_file():
            lines.append(f"{rel}: new (no committed reference)")
            continue
        try:
            lines.append(compare_table(pd.read_csv(run_dir / rel), pd.read_csv(ref), str(rel)).describe())
        except (pd.errors.EmptyDataError, pd.errors.ParserError, TypeError, ValueError, KeyError) as exc:
            lines.append(f"{rel}: not compared ({type(exc).__name__}: {exc})")
    written = set(run_tables)
    for ref in sorted(p.relative_to(reference_dir) for p in reference_dir.glob("*.csv")):
        if ref not in written:
            lines.append(f"{ref}: not written by this run (outside its subset)")
    return lines

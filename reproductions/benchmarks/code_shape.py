"""Print the shape of ``pipelab/``: lines, prose share, long docstrings, long functions, wide signatures.

Prose is docstring lines plus comment lines; a docstring is long over 15 lines (module overviews are
listed apart). Run: ``python reproductions/benchmarks/code_shape.py [--list]``.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "pipelab"
LONG_DOC, LONG_FN, WIDE = 15, 60, 8


def docstrings(tree: ast.Module) -> list[tuple[str, ast.AST, int]]:
    """(kind, node, lines) of every docstring: kind is "module", "class" or "function"."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None and node.body:
                first = node.body[0]
                lines = (first.end_lineno or first.lineno) - first.lineno + 1
                kind = "module" if isinstance(node, ast.Module) else \
                    "class" if isinstance(node, ast.ClassDef) else "function"
                out.append((kind, node, lines))
    return out


def comment_lines(text: str) -> int:
    """Lines holding a comment."""
    rows = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            rows.add(tok.start[0])
    return len(rows)


def shape(root: Path = PKG) -> dict[str, object]:
    """Every figure of the module docstring, with the offending names."""
    lines = prose = 0
    long_docs: list[str] = []
    long_overviews: list[str] = []
    long_fns: list[str] = []
    wide_fns: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root.parent)
        tree = ast.parse(text)
        lines += len(text.splitlines())
        prose += comment_lines(text)
        for kind, node, n in docstrings(tree):
            prose += n
            if n > LONG_DOC:
                where = f"{rel}:{getattr(node, 'name', '<module>')} ({n})"
                (long_overviews if kind == "module" else long_docs).append(where)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > LONG_FN:
                    long_fns.append(f"{rel}:{node.name} ({n})")
                a = node.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                params = [p for p in params if p.arg not in ("self", "cls")]
                if len(params) > WIDE:
                    wide_fns.append(f"{rel}:{node.name} ({len(params)})")
    return {"lines": lines, "prose_share": prose / lines, "long_docstrings": long_docs,
            "long_module_overviews": long_overviews, "long_functions": long_fns, "wide_functions": wide_fns}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="name every long docstring and function")
    args = ap.parse_args()
    s = shape()
    print(f"pipelab/: {s['lines']} lines, prose {s['prose_share']:.1%}")
    for key in ("long_docstrings", "long_module_overviews", "long_functions", "wide_functions"):
        items = s[key]
        assert isinstance(items, list)
        print(f"{key}: {len(items)}")
        if args.list:
            print("  " + "\n  ".join(items))


if __name__ == "__main__":
    main()

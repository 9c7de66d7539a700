"""Write the option-name lists that tests/test_llm_export.py checks pipelab's export against.

Run by hand against clones of the two projects (nothing here runs in the tests)::

    python tests/data/export_options/extract_options.py TORCHTITAN_CLONE MEGATRON_CLONE

torchtitan: the ``section.option`` names of ``JobConfig``'s dataclasses in
``torchtitan/config/job_config.py`` at the last commit that read TOML files (the next one, #2386, moved
configuration to Python functions but keeps the same ``--section.option`` command-line flags).
Megatron-LM: every flag ``megatron/training/arguments.py`` adds, written out (``add_argument('--x'``) or
generated from a config dataclass by ``ArgumentGroupFactory`` (a field ``x_y`` gives ``--x-y``; a
boolean that defaults to True gives ``--no-x-y`` and ``--disable-x-y``; ``arg_names`` overrides).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

TORCHTITAN_COMMIT = "238fa9953e4aec2a62582121564273d7cbb1e9f1"
HERE = Path(__file__).resolve().parent


def _show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def _fields(tree: ast.Module) -> dict[str, list[tuple[str, ast.AnnAssign]]]:
    out: dict[str, list[tuple[str, ast.AnnAssign]]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = [(st.target.id, st) for st in node.body
                              if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)]
    return out


def torchtitan(repo: str) -> list[str]:
    tree = ast.parse(_show(repo, TORCHTITAN_COMMIT, "torchtitan/config/job_config.py"))
    classes = _fields(tree)
    names = []
    for section, st in classes["JobConfig"]:
        cls = ast.unparse(st.annotation)
        names += [f"{section}.{name}" for name, _ in classes.get(cls, [])]
    return sorted(names)


def _dataclass_flags(source: str, cls: str, exclude: set[str]) -> list[str]:
    flags = []
    for name, st in _fields(ast.parse(source)).get(cls, []):
        if name in exclude or name.startswith("_"):
            continue
        text = ast.unparse(st)
        override = re.search(r"'arg_names':\s*\[([^\]]*)\]", text)
        if override:
            flags += re.findall(r"'(--[\w-]+)'", override.group(1))
        elif (ast.unparse(st.annotation) == "bool" and st.value is not None
              and "True" in ast.unparse(st.value)):
            flags += ["--no-" + name.replace("_", "-"), "--disable-" + name.replace("_", "-")]
        else:
            flags.append("--" + name.replace("_", "-"))
    return flags


def megatron(repo: str) -> tuple[str, list[str]]:
    commit = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    args = _show(repo, commit, "megatron/training/arguments.py")
    flags = re.findall(r"add_argument\(\s*'(--[\w-]+)'(?:,\s*'(--[\w-]+)')?", args)
    names = [f for pair in flags for f in pair if f]
    start = args.index("def _add_network_size_args")
    block = args[start:args.index("ArgumentGroupFactory(TransformerConfig", start)]
    exclude = set(re.findall(r'"(\w+)"', block))
    names += _dataclass_flags(_show(repo, commit, "megatron/core/model_parallel_config.py"),
                              "ModelParallelConfig", exclude)
    names += _dataclass_flags(_show(repo, commit, "megatron/core/transformer/transformer_config.py"),
                              "TransformerConfig", exclude)
    names += _dataclass_flags(_show(repo, commit, "megatron/training/config/training_config.py"),
                              "TrainingConfig", set())
    return commit, sorted(set(names))


def main() -> None:
    titan, mega = sys.argv[1], sys.argv[2]
    header = ("# torchtitan JobConfig option names (section.option), from pytorch/torchtitan "
              f"torchtitan/config/job_config.py at {TORCHTITAN_COMMIT}\n")
    (HERE / "torchtitan_options.txt").write_text(header + "\n".join(torchtitan(titan)) + "\n")
    commit, flags = megatron(mega)
    header = ("# Megatron-LM command-line flags, from NVIDIA/Megatron-LM megatron/training/arguments.py at "
              f"{commit}"
              " (written out, and generated from ModelParallelConfig, TransformerConfig, TrainingConfig)\n")
    (HERE / "megatron_options.txt").write_text(header + "\n".join(flags) + "\n")


if __name__ == "__main__":
    main()

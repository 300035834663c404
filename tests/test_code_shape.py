"""Functions that each do one job, checked from the source: none in raysent/ is over 100 lines (the review of
issue 47 held the package to the field's model codebases, whose longest functions are about that long)."""

from __future__ import annotations

import ast

from conftest import REPO

PACKAGE = REPO / "raysent"
MAX_LINES = 100


def test_no_function_is_over_100_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_LINES:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, f"functions over {MAX_LINES} lines (split them into functions that each do one job):\n" + \
        "\n".join(long)

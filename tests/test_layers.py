"""The package's two layers, checked from its source: a torch-only core (config, data, models, methods,
eval, the training loop) and the orchestration over it (Ray Train, Tune, MLflow tracking, reports, bench,
CLI). Every import counts, including those inside functions: no module cycle, and the core imports
nothing from the orchestration, nor Ray or MLflow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "raysent"

# the core; every other module of raysent is orchestration
CORE = ("raysent.errors", "raysent.config", "raysent.data", "raysent.models", "raysent.methods", "raysent.eval",
        "raysent.train.loop", "raysent.train.run", "raysent.train.initial_dev", "raysent.train.device",
        "raysent.train.gather", "raysent.train.memory", "raysent.train.records", "raysent.io", "raysent.reference", "raysent.hub")
ORCHESTRATION_LIBRARIES = ("ray", "mlflow", "optuna")


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """Every module this one imports (raysent's and third-party top-level names), with a line number."""
    out: dict[str, int] = {}
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            key = t if t in modules else t.split(".")[0] if not t.startswith("raysent") else None
            if key and key != name:
                out.setdefault(key, node.lineno)
    return out


def _graph() -> tuple[dict[str, dict[str, int]], dict[str, Path]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}, modules


def _is_core(module: str) -> bool:
    if module == "raysent.train":  # a package __init__ without code
        return True
    if module == "raysent":  # the facade: raysent.search, fit, evaluate and load come from raysent.api
        return False
    return any(module == c or module.startswith(c + ".") for c in CORE)


def test_the_graph_sees_imports_inside_functions():
    graph, _ = _graph()
    # `raysent tune` imports the search inside its command function
    assert "raysent.tune.driver" in graph["raysent.cli.tune"]
    assert "torch" in graph["raysent.methods.losses"]


def test_no_module_imports_itself_through_others():
    graph, _ = _graph()
    internal = {m: {d for d in deps if d in graph} for m, deps in graph.items()}
    cycles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(internal[m]):
            if state.get(d) == 1:
                cycles.append(path[path.index(d):] + [d] if d in path else [m, d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(internal):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_core_imports_no_orchestration():
    graph, modules = _graph()
    bad = []
    for m, deps in graph.items():
        if not _is_core(m):
            continue
        for d, line in deps.items():
            if (d in modules and not _is_core(d)) or d in ORCHESTRATION_LIBRARIES:
                bad.append(f"{modules[m].relative_to(REPO)}:{line} imports {d}")
    assert not bad, "\n".join(bad)


def test_no_private_name_is_imported_from_another_module():
    """A leading underscore means "this module's own": another module that needs it gets a public name."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raysent") or (
                    isinstance(node, ast.ImportFrom) and node.level):
                found += [f"{path.relative_to(REPO)}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "private names imported across modules:\n" + "\n".join(found)


def test_mypy_checks_the_whole_core():
    """pyproject.toml's [tool.mypy] files cover every module of the core (the package's __init__ files too)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    checked = [REPO / f for f in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]["files"]]
    _, modules = _graph()
    core = [path for module, path in modules.items() if _is_core(module)]
    unchecked = [str(p.relative_to(REPO)) for p in core if not any(p == c or c in p.parents for c in checked)]
    assert not unchecked, f"core modules mypy does not check: {unchecked}"

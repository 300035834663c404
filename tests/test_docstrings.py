"""The docs name what exists: every dotted ``raysent.…`` name in a docstring or comment of the package and the
tests, and in the Markdown docs, is a module, or a name a module defines (a class's member included), read from
the source without importing it; and the ``raysent`` command's docstring lists every command it registers."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from conftest import REPO

DOTTED = re.compile(r"\braysent(?:\.[A-Za-z_]\w*)+")
FILE_SUFFIXES = {"json", "yaml", "yml", "md", "py", "txt", "csv", "db"}  # raysent.json is a file's name


def _module_file(parts: list[str]) -> Path | None:
    path = REPO.joinpath(*parts)
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if path.is_dir():  # a package, with or without __init__.py
        return path / "__init__.py" if (path / "__init__.py").is_file() else path
    return None


def _defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body defines (imports included, and those inside if/try blocks)."""
    out: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                out.update((n.id, node) for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            out.update(_defined(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
                                + [s for h in getattr(node, "handlers", []) for s in h.body]))
    return out


def _facade() -> set[str]:
    """What ``raysent`` itself hands out lazily (raysent/__init__.py's ``_API``)."""
    tree = ast.parse((REPO / "raysent" / "__init__.py").read_text())
    node = _defined(tree.body).get("_API")
    assert isinstance(node, ast.Assign), "raysent/__init__.py has no _API"
    return set(ast.literal_eval(node.value))


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        found = _module_file(parts[:i])
        if found is None:
            continue
        rest = parts[i:]
        if not rest:
            return True
        if found.is_dir():
            return False
        scope = _defined(ast.parse(found.read_text()).body)
        if parts[:i] == ["raysent"] and len(rest) == 1 and rest[0] in _facade():
            return True
        node = scope.get(rest[0])
        if node is None or len(rest) > 2:
            return False
        return len(rest) == 1 or (isinstance(node, ast.ClassDef) and rest[1] in _defined(node.body))
    return False


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of a Python file's docstrings and comments, or of a Markdown file's lines."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return list(enumerate(text.splitlines(), 1))
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(text).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def test_every_dotted_raysent_name_in_docstrings_comments_and_docs_exists():
    files = [*(REPO / "raysent").rglob("*.py"), *(REPO / "tests").rglob("*.py"), REPO / "README.md",
             *(REPO / "docs").glob("*.md")]
    missing = []
    for path in files:
        for line, text in _prose(path):
            for m in DOTTED.finditer(text):
                name = m.group(0)
                if name.rsplit(".", 1)[-1] not in FILE_SUFFIXES and not resolves(name):
                    missing.append(f"{path.relative_to(REPO)}:{line}: {name}")
    assert not missing, "names that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_resolver_tells_existing_names_from_gone_ones():
    assert resolves("raysent.train.loop.Stepper.step") and resolves("raysent.tune.driver")
    assert resolves("raysent.search") and resolves("raysent.report.summary")
    assert not resolves("raysent.tune.search") and not resolves("raysent.train.loop.LocalHooks")
    assert not resolves("raysent.train.loop.Stepper.no_such_method")


def test_the_command_docstring_lists_every_command():
    import raysent.cli
    from raysent.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    listed = set(re.findall(r"^\s+raysent (\w+)", raysent.cli.__doc__ or "", flags=re.M))
    assert listed == set(sub.choices), (sorted(listed), sorted(sub.choices))

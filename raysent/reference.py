"""The experiment-file reference (docs/reference.md), generated from the schema: every field of
:class:`raysent.config.ExperimentConfig` and every method's ``params``, with type, default and
description as the code defines them. ``python -m raysent.reference > docs/reference.md`` writes it;
tests/test_reference.py fails when the file and the schema disagree."""

from __future__ import annotations

import re
import sys
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from raysent.config import ExperimentConfig
from raysent.methods.spec import SPECS


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (directly or as ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else None
    return None


def _type(annotation: Any) -> str:
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    text = re.sub(r"\b(typing|typing_extensions|pydantic\.functional_validators)\.", "", text)
    text = re.sub(r"Annotated\[(\w+), [^\]]*\]", r"\1", text)
    text = re.sub(r"<class '(\w+)'>", r"\1", text)
    return text.replace("NoneType", "None").replace("|", "\\|")


def _default(field) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, tuple):
        value = list(value)
    return f"`{value!r}`".replace("|", "\\|") if value is not None else "`null`"


def _rows(model: type[BaseModel], prefix: str, out: list[str], sections: list[tuple[str, type[BaseModel]]]) -> None:
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        sub = _model_of(field.annotation)
        if sub is not None:
            sections.append((path, sub))
            anchor = path.replace(".", "")  # GitHub's heading anchors drop the dots
            out.append(f"| `{path}` | section | {_default(field)} | {field.description or ''} [below](#{anchor}) |")
            continue
        desc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        out.append(f"| `{path}` | {_type(field.annotation)} | {_default(field)} | {desc} |")


def _table(model: type[BaseModel], prefix: str, out: list[str]) -> list[tuple[str, type[BaseModel]]]:
    sections: list[tuple[str, type[BaseModel]]] = []
    out += ["| field | type | default | what it is |", "| --- | --- | --- | --- |"]
    _rows(model, prefix, out, sections)
    return sections


def experiment_reference() -> str:
    """The reference as Markdown."""
    out = ["# Experiment file reference", "",
           "Every field an experiment YAML can hold (`raysent train|tune FILE`), generated from the schema in",
           "`raysent/config.py` and the methods' parameter classes (`python -m raysent.reference >",
           "docs/reference.md`). The method's own defaults (the paper's) replace the `train`, `data` and `model`",
           "defaults below where the method sets them: `raysent methods` lists them. Guides:",
           "[experiments](experiments.md), [search](search.md), [evaluation](evaluation.md).", "",
           "## Top level", ""]
    pending = _table(ExperimentConfig, "", out)
    while pending:
        path, model = pending.pop(0)
        out += ["", f"## {path}", ""]
        doc = (model.__doc__ or "").strip()
        if doc and not doc.startswith(("A base class", "Usage docs")):
            out += [doc.splitlines()[0], ""]
        pending += _table(model, f"{path}.", out)
    out += ["", "## params", "",
            "The method's hyperparameters, by method (`params.<name>`; the defaults are the paper's).", ""]
    for name, cls in SPECS.items():
        out += [f"### {name}", "", f"{cls.paper}.", ""]
        params = cls.Params
        if not params.model_fields:
            out += ["No parameters.", ""]
            continue
        _table(params, "params.", out)
        out.append("")
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(experiment_reference())

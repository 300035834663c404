"""docs/reference.md is the schema's own description of an experiment file: regenerated, it is unchanged."""

from __future__ import annotations

from raysent.config import ExperimentConfig
from raysent.methods import METHODS
from raysent.reference import experiment_reference

from conftest import REPO


def test_the_reference_in_docs_is_the_schema():
    text = experiment_reference()
    assert (REPO / "docs" / "reference.md").read_text() == text, \
        "docs/reference.md is out of date: python -m raysent.reference > docs/reference.md"


def test_every_field_and_method_parameter_is_listed():
    text = experiment_reference()
    for section in ("model", "data", "train", "search", "resources", "tracking", "eval"):
        assert section in ExperimentConfig.model_fields and f"## {section}\n" in text, section
    assert "| `train.lr` | float | `3e-05` | peak learning rate (AdamW) |" in text
    assert "| `search.scheduler.grace_period` | int | `1` |" in text
    for name, cls in METHODS.items():
        assert f"### {name}\n" in text
        for field in cls.Params.model_fields:
            assert f"| `params.{field}` |" in text.split(f"### {name}\n")[1].split("### ")[0], (name, field)

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


def test_eval_options_of_the_command_line_are_the_schemas():
    """`raysent eval`'s --probe, --kfold, --search-data ... are eval.* fields: same default, help and choices."""
    from raysent.cli import build_parser
    from raysent.cli.evaluate import EVAL_OPTIONS
    from raysent.config import EvalConfig

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices["eval"]
    actions = {a.dest: a for a in sub._actions}
    for name in EVAL_OPTIONS:
        field, action = EvalConfig.model_fields[name], actions[name]
        assert action.option_strings == ["--" + name.replace("_", "-")]
        if name == "max_length":  # by default what the model was saved with (raysent.json), else the schema's
            assert action.default is None and "else 256" in action.help
        else:
            assert action.default == field.get_default(call_default_factory=True), name
        assert action.help.startswith(field.description), name
    assert actions["probe"].choices == ["logreg", "mlp"] and actions["kfold"].type is int


def test_an_experiment_file_sets_the_evaluators_options():
    from raysent.config import parse_config

    cfg = parse_config({"name": "x", "method": "simcse-unsup", "model": {"name": "m"},
                        "eval": {"tasks": ["sts", "senteval"], "probe": "mlp", "nhid": 0, "kfold": 5,
                                 "senteval_tasks": ["CR"], "search_data": "sickr:test"}}, source="x.yaml")
    opts = cfg.eval.task_options()
    assert opts["senteval"] == {"classifier": "mlp", "kfold": 5, "mrpc_features": "senteval", "n_jobs": 1,
                                "nhid": 0, "tasks": ["CR"]}
    assert opts["search"] == {"data": "sickr:test", "min_score": None}
    assert opts["sts"] == {"aggregation": "all"}

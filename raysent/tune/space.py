"""The YAML ``search.space`` as an Optuna define-by-run space (conditional entries included).

Entry types: ``uniform``, ``loguniform`` (optional ``step``), ``int`` (optional ``step``) and
``choice``. ``when: {other: value}`` samples an entry only when the choice ``other`` was given
``value`` (or, for list values such as ConSERT's augmentation pairs, contains it): ConSERT's cutoff
rate is searched only when a cutoff is among the two views. Choice values that Optuna cannot
store (lists, mappings) are given to it as labels and decoded back here. Imports no Ray.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from typing import Any, Literal

from raysent.config import ExperimentConfig, ModelConfig, SpaceEntry, TrainConfig, hyperparameters
from raysent.errors import RaysentError

# Lazy imports: raysent's heavier modules (heavy, and only the functions that need them import them).

PRIMITIVE = (str, int, float, bool, type(None))


def _label(value: Any) -> Any:
    if isinstance(value, PRIMITIVE):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "+".join(value)
    return json.dumps(value, sort_keys=True)


def choices(entry: SpaceEntry) -> list[Any]:
    """A ``choice`` entry's values (the schema gives every choice entry some)."""
    if entry.values is None:
        raise RaysentError(f"a {entry.type!r} search-space entry has no 'values'")
    return entry.values


def bounds(entry: SpaceEntry) -> tuple[float, float]:
    """A ``uniform``, ``loguniform`` or ``int`` entry's (low, high) (the schema gives every such entry both)."""
    if entry.low is None or entry.high is None:
        raise RaysentError(f"a {entry.type!r} search-space entry needs 'low' and 'high'")
    return entry.low, entry.high


def labels(entry: SpaceEntry) -> dict:
    """{label Optuna sees: the YAML value}."""
    return {_label(v): v for v in choices(entry)}


def _active(entry: SpaceEntry, chosen: dict) -> bool:
    for ref, want in (entry.when or {}).items():
        if ref not in chosen:
            return False
        got = chosen[ref]
        if not (got == want or (isinstance(got, (list, tuple)) and want in got)):
            return False
    return True


def ordered(space: dict[str, SpaceEntry]) -> list[str]:
    """Entries after the choices they depend on (the schema allows one level of conditions)."""
    return sorted(space, key=lambda n: 1 if space[n].when else 0)


def suggest(trial, space: dict[str, SpaceEntry]) -> dict:
    """Define-by-run: ask ``trial`` (an optuna.Trial) for every active entry; returns the values."""
    chosen: dict[str, Any] = {}
    for name in ordered(space):
        e = space[name]
        if not _active(e, chosen):
            continue
        if e.type == "choice":
            table = labels(e)
            chosen[name] = table[trial.suggest_categorical(name, list(table))]
        elif e.type == "int":
            low, high = bounds(e)
            chosen[name] = trial.suggest_int(name, int(low), int(high), step=int(e.step or 1))
        else:
            low, high = bounds(e)
            chosen[name] = trial.suggest_float(name, low, high, log=e.type == "loguniform",
                                               step=e.step if e.type == "uniform" else None)
    return chosen


def decode(config: dict, space: dict[str, SpaceEntry]) -> dict:
    """A Tune trial config (Optuna's labels, or a grid point) -> the hyperparameter values."""
    if "hp" in config:  # grid points carry the decoded values already
        return dict(config["hp"])
    out = {}
    for name, e in space.items():
        if name not in config:
            continue
        out[name] = labels(e).get(config[name], config[name]) if e.type == "choice" else config[name]
    return out


def grid(space: dict[str, SpaceEntry]) -> list[dict]:
    """Every combination of the choice entries, inactive conditional entries left out (no repeats)."""
    names = ordered(space)
    points, seen = [], set()
    for combo in itertools.product(*(choices(space[n]) for n in names)):
        chosen: dict[str, Any] = {}
        for name, value in zip(names, combo):
            if _active(space[name], chosen):
                chosen[name] = value
        key = json.dumps(chosen, sort_keys=True)
        if key not in seen:
            seen.add(key)
            points.append(chosen)
    return points


def config_id(hp: dict) -> str:
    """A short stable id of one configuration (groups its seeds in files, MLflow and tables)."""
    return hashlib.sha1(json.dumps(hp, sort_keys=True, default=str).encode()).hexdigest()[:10]


def _own_value(cfg: ExperimentConfig, name: str) -> Any:
    """The experiment's value of a searched entry: a flat hyperparameter name, or a dotted path."""
    if "." not in name:
        return hyperparameters(cfg).get(name)
    node: Any = cfg.to_dict()
    for part in name.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _paper_value(cfg: ExperimentConfig, name: str) -> Any:
    """The method's paper default of a searched entry (what the value would be had the file not set it)."""
    from raysent.methods.spec import get_spec

    method = get_spec(cfg.method)
    defaults = method.defaults(cfg.method_params)
    params = type(cfg.method_params).model_fields
    section, _, field = name.rpartition(".")
    if section in ("", "params") and field in params:
        return params[field].default
    if section in ("", "model") and field == "dropout":
        return defaults["model"].get("dropout", ModelConfig.model_fields["dropout"].default)
    if section in ("", "train") and field in TrainConfig.model_fields:
        return defaults["train"].get(field, TrainConfig.model_fields[field].default)
    return defaults.get(section, {}).get(field)


# the warm-start arm in words, by where its values come from (warm_source): the driver's lines, the Python API's arms
WARM_ARMS = {"paper": "the paper's setting", "file": "the file's setting"}


def warm_source(cfg: ExperimentConfig) -> Literal["paper", "file"]:
    """Where the warm-start configuration's values come from: ``paper`` when each is the method's paper default,
    ``file`` when the experiment file set one to something else (the README's main job sets lr 1e-4, where
    SimCSE's is 3e-5): the arm is named for that, in the summary, the table and MLflow."""
    from raysent.methods.spec import get_spec

    variants = get_spec(cfg.method).variants  # each variant is one of the paper's settings (eq6/eq7/eq8, ...)
    point, _ = paper_point(cfg)
    for name, value in (point or {}).items():
        if name.rpartition(".")[2] in variants:
            continue
        paper = _paper_value(cfg, name)
        same = (math.isclose(float(value), float(paper), rel_tol=1e-9)
                if isinstance(value, (int, float)) and isinstance(paper, (int, float)) else value == paper)
        if not same:
            return "file"
    return "paper"


def paper_point(cfg: ExperimentConfig) -> tuple[dict | None, str]:
    """The experiment's own values of its searched entries (the method's paper defaults, or what the file
    fixed), decoded; and, if they are not a point of the space Optuna samples (a value outside a range, not
    among a choice's values), why (a grid can still take them as an extra point). None: a value is unset."""
    space = cfg.search.space if cfg.search else {}
    point: dict[str, Any] = {}
    outside = ""
    for name in ordered(space):
        e = space[name]
        if not _active(e, point):
            continue
        value = _own_value(cfg, name)
        if value is None:
            return None, f"{name} has no value of its own"
        if e.type == "choice":
            if value not in choices(e) and not outside:
                outside = f"{name}={value!r} is not among its searched values {e.values}"
        elif not (bounds(e)[0] <= value <= bounds(e)[1]) and not outside:
            outside = f"{name}={value!r} is outside its searched range [{e.low}, {e.high}]"
        point[name] = int(value) if e.type == "int" else value
    return point, outside


def encode(point: dict, space: dict[str, SpaceEntry]) -> dict:
    """Decoded values -> what Optuna's trial sees (choice labels), for ``enqueue_trial``."""
    return {k: _label(v) if space[k].type == "choice" else v for k, v in point.items()}

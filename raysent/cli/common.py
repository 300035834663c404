"""What the commands share: the environment epilog, --set, --format json's stdout, list options."""

from __future__ import annotations

import contextlib
import sys
import types
import typing

import yaml

from raysent.errors import RaysentError

# Lazy imports: numpy, yaml, raysent's heavier modules (the command's work is imported when it runs, so `raysent
# --help` and every other command start without torch, Ray or MLflow).

EPILOG = """environment:
  RAYSENT_DATA_DIR   folder with the layout of shared/data, looked at before the Hugging Face hub
  RAYSENT_MODEL_DIR  folder of save_pretrained model folders, looked at before the hub
  RAYSENT_CACHE_DIR  where the untuned model's dev scores and an empty MLflow store are kept for the next run
                     (default ~/.cache/raysent)
  HF_HUB_OFFLINE=1   never try the hub (fail fast with a message that says where raysent looked)
"""


def parse_set(values: list[str] | None) -> dict:
    """``--set key=value`` pairs; values are read as YAML (numbers, lists, true/false)."""
    out = {}
    for item in values or []:
        if "=" not in item:
            raise RaysentError(f"--set {item!r}: expected KEY=VALUE, e.g. --set temperature=0.1")
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = yaml.safe_load(value)
        except yaml.YAMLError:
            out[key.strip()] = value
    return out


def check_results_dir(path: str) -> None:
    """``--results-dir``: a folder, or a path where one can be created; a file there is named as a file."""
    from raysent.io import not_a_folder

    why = not_a_folder(path)
    if why:
        raise RaysentError(f"--results-dir {path}: {why}; give the folder that holds the experiments' "
                           "results (default: results)")


def stdout_for(fmt: str):
    """With --format json, stdout carries the JSON alone: what Ray and Tune print meanwhile (worker
    logs forwarded to the driver, Tune's status tables) goes to stderr."""
    return contextlib.redirect_stdout(sys.stderr) if fmt == "json" else contextlib.nullcontext()


def is_connected() -> bool:
    """Whether this process is connected to a Ray (one that never imported ray is not)."""
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


def disconnect_ray() -> None:
    """Leave Ray before the summary is printed: Ray holds back worker log lines that repeat across
    processes (its log deduplication) and prints what it still holds when the driver disconnects, which
    would otherwise be at exit, after the summary."""
    ray = sys.modules.get("ray")  # a run in this process never imported it: nothing to leave
    if ray is not None and ray.is_initialized():
        ray.shutdown()


def yaml_dump(obj) -> str:
    import yaml

    return yaml.safe_dump(obj, sort_keys=False, default_flow_style=None, allow_unicode=True, width=110).rstrip()


def split_list(values: list[str] | None) -> list[str]:
    """Values of a repeatable, comma-separated option, in order."""
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def json_default(o):
    import numpy as np

    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, set):
        return sorted(o)
    return str(o)


def add_schema_options(parser, model, fields: list[str], metavars: dict[str, str] | None = None,
                       defaults: dict[str, tuple] | None = None) -> None:
    """``--<field>`` options (``_`` as ``-``) whose type, choices, default and help are those of the fields of
    the pydantic ``model``: an option that an experiment file can also hold is defined once, in the schema.
    ``defaults``: ``{field: (default, what the help says of it)}`` where the command's default differs."""
    for name in fields:
        field = model.model_fields[name]
        annotation = field.annotation
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        default = field.get_default(call_default_factory=True)
        kwargs: dict = {"dest": name, "default": default, "help": field.description or ""}
        if typing.get_origin(annotation) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(annotation))
        elif typing.get_origin(annotation) is list:
            kwargs["nargs"] = "+"
        elif annotation in (int, float):
            kwargs["type"] = annotation
        if metavars and name in metavars:
            kwargs["metavar"] = metavars[name]
        if defaults and name in defaults:
            kwargs["default"] = defaults[name][0]
            kwargs["help"] += f" (default: {defaults[name][1]})"
        elif default is not None:
            kwargs["help"] += f" (default {default})"
        parser.add_argument("--" + name.replace("_", "-"), **kwargs)

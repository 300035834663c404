"""Build what the loop needs from a config, and train in this process (one worker)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from raysent.config import ExperimentConfig
from raysent.data import load
from raysent.data.batching import TokenizedData
from raysent.methods import Method, get_method
from raysent.models.encoder import Encoder
from raysent.train.loop import TrainHooks, run_training, write_json_atomic

log = logging.getLogger("raysent.train")


def build_method(cfg: ExperimentConfig) -> Method:
    encoder = Encoder.load(cfg.model.name, dropout=cfg.model.dropout)
    return get_method(cfg.method)(encoder, cfg.method_params)


def prepare_data(cfg: ExperimentConfig, method: Method) -> tuple[TokenizedData, np.ndarray | None, dict]:
    """Tokenized training data, the grouping of examples (or None), and a description for the record."""
    data = load(cfg.data.train, method.data_kind(method.params))
    if cfg.data.max_train_samples is not None and cfg.data.max_train_samples < len(data):
        data = _head(data, cfg.data.max_train_samples)
    fields, extras = method.fields(data)
    max_len = min(cfg.train.max_length, method.encoder.max_positions)
    tok = TokenizedData(fields, method.encoder.tokenizer, max_len, extras)
    info = {"spec": cfg.data.train, "examples": len(tok), "source": data.source,
            "transductive": data.transductive, "notes": list(data.notes)}
    return tok, method.groups(data), info


def _head(data, n: int):
    import dataclasses

    changes = {}
    for f in dataclasses.fields(data):
        v = getattr(data, f.name)
        if f.name not in ("name", "source", "notes", "transductive") and hasattr(v, "__len__") and len(v) == len(data):
            changes[f.name] = v[:n]
    return dataclasses.replace(data, **changes)


def train_in_process(cfg: ExperimentConfig, resume: bool = False, quiet: bool = False,
                     fail_at_step: int | None = None) -> dict:
    """`raysent train` without resources.workers: the loop in this process, results in output_dir."""
    out = cfg.output_dir()
    t0 = time.time()
    hooks = TrainHooks(out, resume=resume, quiet=quiet)
    method = build_method(cfg)
    data, groups, info = prepare_data(cfg, method)
    summary = run_training(cfg, method, data, cfg.data.dev, hooks, groups=groups, fail_at_step=fail_at_step)
    return finish(cfg, summary, info, out, t0)


def finish(cfg: ExperimentConfig, summary: dict, data_info: dict, out: Path, t0: float) -> dict:
    summary = {**summary, "name": cfg.name, "seed": cfg.train.seed, "model": cfg.model.name,
               "data": data_info, "transductive": data_info["transductive"], "output_dir": str(out),
               "best_model_dir": str(out / "best"), "wall_seconds": time.time() - t0,
               "config": cfg.to_dict()}
    write_json_atomic(out / "result.json", summary)
    return summary

"""Build what the loop needs from a config, and train in this process (one worker)."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from raysent.config import ExperimentConfig, with_overrides
from raysent.data import load, parse_spec
from raysent.data.batching import TokenizedData
from raysent.io import write_json_atomic
from raysent.methods import Method, get_method
from raysent.methods.spec import PREVIOUS_STAGE_BEST
from raysent.models import cache as encoder_cache
from raysent.models.cache import load_encoder
from raysent.models.encoder import Encoder
from raysent.train.device import default_device
from raysent.train.device import resolve as resolve_settings
from raysent.train.loop import TrainHooks, run_training, set_seed
from raysent.train.memory import use_huge_pages
from raysent.train.records import TrainSummary, read_summary

log = logging.getLogger("raysent.train")


def build_method(cfg: ExperimentConfig) -> Method:
    # the heads (SimCSE's MLP, SG's projection, the layer-attention pooler, the NLI classifier) are
    # initialised here: seeded, so a run is reproducible and the same on every worker
    if resolve_settings(cfg.train, default_device()).huge_pages:  # auto: on a CPU only (raysent.train.device)
        use_huge_pages()  # before the model's weights: PyTorch reads its switch at the first large tensor
    set_seed(cfg.train.seed)
    # read from disk once per process that reuses runs (reuse_across_runs): a fresh copy, the same weights and heads
    encoder = load_encoder(cfg.model.name, dropout=cfg.model.dropout, revision=cfg.model.revision)
    return get_method(cfg.method)(encoder, cfg.method_params)


# --------------------------------------------------------------------------- what the next run of this process reuses
# A process that trains one run after another (a Tune trial process that Tune reuses for the next trial) reads the
# model from disk once (raysent.models.cache), and reads and tokenizes each training set once: the data read and
# the tokenized data, keyed by everything that decides them (data spec, max_train_samples, the tokenizer's files,
# max length, the texts and extras the method takes), are kept for the next run (the TOKENIZED_KEPT used last).
# Off by default: a process that trains once would only hold them longer.
TOKENIZED_KEPT = 2
_reuse = False
_tokenized: OrderedDict[tuple, TokenizedData] = OrderedDict()
_loaded: OrderedDict[tuple, Any] = OrderedDict()  # the data sets read (training_data)
_tokenized_lock = threading.Lock()


def reuse_across_runs(on: bool = True) -> None:
    """Keep the model read from disk and the tokenized training data for the next run of this process (each run
    gets its own copy of the weights, and the same tokens it would tokenize itself); ``on=False``: stop and
    forget them."""
    global _reuse
    encoder_cache.enable(on)
    with _tokenized_lock:
        _reuse = on
        if not on:
            _tokenized.clear()
            _loaded.clear()


def texts_digest(fields: dict[str, list[str]], extras: dict[str, Any]) -> str:
    """A digest of the texts to tokenize and the per-example extras (what a method's ``fields`` gives)."""
    h = hashlib.blake2b(digest_size=20)
    for name, texts in fields.items():
        h.update(f"{name}\x00{len(texts)}\x00".encode())
        h.update("\x00".join(texts).encode("utf-8", "surrogatepass"))
    for name, values in extras.items():
        arr = np.asarray(values)
        h.update(f"\x01{name}\x00{arr.dtype}\x00{arr.shape}\x00".encode())
        h.update(repr(arr.tolist()).encode() if arr.dtype == object else np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def tokenize(fields: dict[str, list[str]], extras: dict[str, Any], encoder: Encoder, max_length: int,
             spec: tuple = ()) -> TokenizedData:
    """``TokenizedData(fields, encoder.tokenizer, max_length, extras)``; with :func:`reuse_across_runs`, once per
    process for the same data spec (``spec``), tokenizer (its files), max length and texts."""
    if not _reuse:
        return TokenizedData(fields, encoder.tokenizer, max_length, extras)
    tokenizer = encoder.tokenizer
    key = (*spec, encoder_cache.signature(encoder.source), type(tokenizer).__name__, len(tokenizer), max_length,
           texts_digest(fields, extras))
    with _tokenized_lock:
        kept = _tokenized.get(key)
        if kept is not None:
            _tokenized.move_to_end(key)
            return kept
    tok = TokenizedData(fields, tokenizer, max_length, extras)
    with _tokenized_lock:
        if _reuse:
            _tokenized[key] = tok
            while len(_tokenized) > TOKENIZED_KEPT:
                _tokenized.popitem(last=False)
    return tok


def training_data(spec: str, kind: str, max_train_samples: int | None) -> Any:
    """The training data set ``spec`` as ``kind``, cut to ``max_train_samples``; with :func:`reuse_across_runs`,
    read once per process (for the same data folder and, for ``path:FILE``, the same file): the runs read it,
    never change it."""
    key: tuple = ()
    if _reuse:
        name, parts = parse_spec(spec)
        key = (spec, kind, max_train_samples, os.environ.get("RAYSENT_DATA_DIR"),
               encoder_cache.signature(parts[0]) if name == "path" else ())
        with _tokenized_lock:
            kept = _loaded.get(key)
            if kept is not None:
                _loaded.move_to_end(key)
                return kept
    data = load(spec, kind)
    if max_train_samples is not None and max_train_samples < len(data):
        data = _subset(data, max_train_samples)
    with _tokenized_lock:
        if _reuse and key:
            _loaded[key] = data
            while len(_loaded) > TOKENIZED_KEPT:
                _loaded.popitem(last=False)
    return data


def prepare_data(cfg: ExperimentConfig, method: Method) -> tuple[TokenizedData, np.ndarray | None, dict]:
    """Tokenized training data, the grouping of examples (or None), and a description for the record."""
    assert cfg.data.train is not None, "parse_config gives every run its training data"
    kind = method.data_kind(method.params)
    data = training_data(cfg.data.train, kind, cfg.data.max_train_samples)
    fields, extras = method.fields(data)
    max_len = min(cfg.train.max_length, method.encoder.max_positions)
    tok = tokenize(fields, extras, method.encoder, max_len, spec=(cfg.data.train, kind, cfg.data.max_train_samples))
    info = {"spec": cfg.data.train, "examples": len(tok), "source": data.source,
            "transductive": data.transductive, "notes": list(data.notes)}
    return tok, method.groups(data), info


SUBSET_SEED = 0  # the same subset for every training seed: seeds then differ only in the training itself


def _subset(data, n: int):
    """A random subset of n examples, in their original order (the head of a file is often one genre:
    sts-unlabeled starts with STS12's news, so a head would not be a sample of the set)."""
    idx = np.sort(np.random.default_rng(SUBSET_SEED).choice(len(data), size=n, replace=False))
    changes = {}
    for f in dataclasses.fields(data):
        v = getattr(data, f.name)
        if f.name not in ("name", "source", "notes", "transductive") and hasattr(v, "__len__") and len(v) == len(data):
            changes[f.name] = v[idx] if isinstance(v, np.ndarray) else type(v)(v[i] for i in idx)
    return dataclasses.replace(data, **changes)


def train_stages(cfg: ExperimentConfig, train_one: Callable[[ExperimentConfig], TrainSummary],
                 resume: bool = False, log: Callable[[str], None] = print) -> TrainSummary:
    """Run a method's stages in order (one stage for most methods), each from the last one's best model.

    A finished stage (its result.json exists) is not run again with ``resume``.
    """
    stages = get_method(cfg.method).stages(cfg)
    if not stages:
        return train_one(cfg)
    out = cfg.output_dir()
    previous, records = None, []
    for i, (label, overrides) in enumerate(stages):
        last = i == len(stages) - 1
        stage_out = _stage_dir(out, label, last)
        ov = {k: (previous if v == PREVIOUS_STAGE_BEST else v) for k, v in overrides.items()}
        ov["train.output_dir"] = str(stage_out)
        stage_cfg = with_overrides(cfg, ov)
        done = stage_out / "result.json"
        if resume and not last and done.is_file():
            summary = read_summary(done)
            log(f"stage {label}: already finished ({done}), not run again")
        else:
            log(f"stage {i + 1}/{len(stages)} ({label}): {stage_cfg.method} on {stage_cfg.data.train}")
            summary = train_one(stage_cfg)
        previous = summary.best_model_dir
        records.append({"stage": label, "method": stage_cfg.method, "data": stage_cfg.data.train,
                        "best_dev_spearman": summary.best_dev_spearman, "best_step": summary.best_step,
                        "initial_dev": summary.initial_dev, "output_dir": summary.output_dir})
    summary = summary.model_copy(update={"stages": records, "initial_dev": records[0]["initial_dev"]})
    write_json_atomic(out / "result.json", summary.to_json())
    return summary


def _stage_dir(out: Path, label: str, last: bool) -> Path:
    """Where a stage of a multi-stage run trains: the run's own folder for the last, a subfolder for earlier ones."""
    return out if last else out / label


def stage_dirs(cfg: ExperimentConfig) -> list[Path]:
    """The folder every stage of a run trains in, in order (one for most methods)."""
    stages = get_method(cfg.method).stages(cfg)
    out = cfg.output_dir()
    if not stages:
        return [out]
    return [_stage_dir(out, label, i == len(stages) - 1) for i, (label, _) in enumerate(stages)]


def delete_checkpoints(cfg: ExperimentConfig) -> None:
    """Delete a finished in-process run's resume checkpoints (model and optimizer state) of every stage: what
    only a resumed run reads. Its best model(s) and result.json stay. (A Ray Train run keeps its checkpoints in
    Ray's storage: :func:`raysent.train.ray_train.delete_checkpoints` deletes those too.)"""
    for stage_out in stage_dirs(cfg):
        shutil.rmtree(stage_out / "checkpoint", ignore_errors=True)


def train_once(cfg: ExperimentConfig, hooks: TrainHooks, startup: dict | None = None) -> TrainSummary:
    """One stage of one run, the same on every path (in this process, in a Tune trial, on each Ray Train
    worker): build the method, prepare its data, run the loop with ``hooks``. Returns the loop's summary with
    ``data`` (what it trained on) and ``startup`` (seconds to build the method and to prepare the data)."""
    t = time.perf_counter()
    method = build_method(cfg)
    built = time.perf_counter()
    data, groups, info = prepare_data(cfg, method)
    startup = {**(startup or {}), "build_method_seconds": built - t,
               "prepare_data_seconds": time.perf_counter() - built}
    return run_training(cfg, method, data, cfg.data.dev, hooks, groups=groups,
                        record={"data": info, "startup": startup})


def train_in_process(cfg: ExperimentConfig, resume: bool = False, quiet: bool = False,
                     hooks: Callable[..., TrainHooks] = TrainHooks) -> TrainSummary:
    """Every stage of a run with the loop in this process (`raysent train` without resources.workers, and a
    Tune trial that trains in its own process, with ``hooks`` that report to Tune: the hooks' class, or a
    ``functools.partial`` of it holding the trial's own objects, called as ``hooks(output_dir, resume=, quiet=)``
    for each stage); results in output_dir."""

    def train_one(stage_cfg: ExperimentConfig) -> TrainSummary:
        out = stage_cfg.output_dir()
        t0 = time.time()
        summary = train_once(stage_cfg, hooks(out, resume=resume, quiet=quiet))
        return finish(stage_cfg, summary, out, t0)

    return train_stages(cfg, train_one, resume=resume, log=(lambda m: None) if quiet else stderr)


def stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def finish(cfg: ExperimentConfig, summary: TrainSummary, out: Path, t0: float) -> TrainSummary:
    """The run's summary with what the driver knows (name, seed, folders, wall time, config), in result.json."""
    summary = summary.model_copy(update={
        "name": cfg.name, "seed": cfg.train.seed, "model": cfg.model.name,
        "transductive": summary.data["transductive"], "output_dir": str(out), "best_model_dir": str(out / "best"),
        "wall_seconds": time.time() - t0, "config": cfg.to_dict()})
    write_json_atomic(out / "result.json", summary.to_json())
    return summary

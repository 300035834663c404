"""One measured training case of ``raysent bench``, each in a fresh process of its own.

A fresh process per case keeps the cases from sharing caches, allocator state or threads, and makes
its peak resident memory (``ru_maxrss``) the case's own. Run as::

    python -m raysent.bench.cases '{"kind": "method", "config": {...}, "warmup": 5, "steps": 30}'

and it prints one line ``RESULT {json}``. Two kinds:

* ``method``: a raysent method trained through :class:`raysent.train.loop.Stepper` (exactly the
  loop's optimizer step: length buckets, views, gradient cache, AdamW, schedule), no evaluation;
* ``st-mnrl``: sentence-transformers' ``MultipleNegativesRankingLoss`` fitted with its
  ``SentenceTransformerTrainer`` on the same model, sentences, batch size and sequence length, each
  sentence its own positive (the unsupervised-SimCSE recipe of sentence-transformers' docs).

Both time ``steps`` optimizer steps after ``warmup`` untimed ones, data loading included.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import sys
import tempfile
import time
import warnings
from typing import TYPE_CHECKING

from raysent.config import parse_config
from raysent.data import load

if TYPE_CHECKING:
    from pydantic import BaseModel

# Lazy imports: datasets, sentence_transformers, torch, transformers, raysent's heavier modules (heavy, and only the
# functions that need them import them).

RESULT_PREFIX = "RESULT "


class PartFailed(Exception):
    """A bench part that failed after measuring some of its cases: ``partial`` holds what it measured, as the
    part's section of :class:`raysent.bench.result.BenchResult`."""

    def __init__(self, partial: BaseModel):
        super().__init__("the part failed midway")
        self.partial = partial


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _sync(torch) -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _cuda_peak_mib(torch) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def method_case(spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="raysent-bench-") as scratch:
        return _method_case(spec, scratch)


def _method_case(spec: dict, scratch: str) -> dict:
    import torch

    from raysent.data.batching import GlobalBatches
    from raysent.train.loop import Stepper, TrainHooks, build_optimizer
    from raysent.train.run import build_method, prepare_data

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    cfg = parse_config(spec["config"], source="<raysent bench>")
    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    total = warmup + steps
    method = build_method(cfg)
    data, groups, info = prepare_data(cfg, method)
    hooks = TrainHooks(scratch, quiet=True)
    method.to(hooks.device)
    optimizer, scheduler = build_optimizer(cfg, method, total)
    stepper = Stepper(cfg, method, hooks, optimizer, scheduler)
    started = time.perf_counter()
    prepared = method.prepare(data, hooks.device)
    prepare_seconds = time.perf_counter() - started
    order = GlobalBatches(len(data), cfg.train.batch_size, seed=cfg.train.seed, groups=groups)
    batches = [b for epoch in range(total // max(len(order), 1) + 1) for b in order.epoch(epoch)][:total]
    method.train()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    tokens = 0
    loss = None
    for i, idx in enumerate(batches):
        if i == warmup:
            _sync(torch)
            t0 = time.perf_counter()
        batch = data.collate(idx)
        if i >= warmup:
            tokens += sum(int(v["attention_mask"].sum()) for v in batch.values() if isinstance(v, dict))
        loss = stepper.step(batch, i)
    _sync(torch)
    seconds = time.perf_counter() - t0
    fields = len(data.ids)
    b = cfg.train.batch_size
    n_params = sum(p.numel() for n, p in method.encoder.model.named_parameters() if "embeddings" not in n)
    return {
        "steps": steps, "seconds": seconds, "steps_per_second": steps / seconds,
        "examples_per_second": steps * b / seconds, "sentences_per_second": steps * b * fields / seconds,
        "fields_per_example": fields, "real_tokens_per_step": tokens / steps,
        "encoder_params_non_embedding": n_params,
        "peak_rss_mib": _peak_rss_mib(), "cuda_peak_mib": _cuda_peak_mib(torch),
        "device": hooks.device.type, "precision": stepper.precision,
        "threads": torch.get_num_threads(), "prepare": prepared, "prepare_seconds": prepare_seconds,
        "last_loss": loss, "data": info["source"],
    }


def st_mnrl_case(spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="raysent-bench-st-") as scratch:
        return _st_mnrl_case(spec, scratch)


def _st_mnrl_case(spec: dict, scratch: str) -> dict:
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from transformers import TrainerCallback

    from raysent.models.encoder import resolve_model

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    total = warmup + steps
    b = int(spec["batch_size"])
    path, _ = resolve_model(spec["model"])
    model = SentenceTransformer(path, device="cuda" if torch.cuda.is_available() else "cpu")
    model.max_seq_length = int(spec["max_length"])
    sentences = list(load(spec["data"], "sentences").sentences())[: b * total]
    if len(sentences) < b * total:
        raise RuntimeError(f"{spec['data']}: {len(sentences)} sentences, {b * total} needed")
    train = Dataset.from_dict({"anchor": sentences, "positive": sentences})
    loss = losses.MultipleNegativesRankingLoss(model, scale=1.0 / float(spec["temperature"]))
    stamps: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            _sync(torch)
            stamps.append(time.perf_counter())

    args = SentenceTransformerTrainingArguments(
        output_dir=scratch, per_device_train_batch_size=b, max_steps=total,
        learning_rate=float(spec["lr"]), warmup_ratio=0.0, lr_scheduler_type="linear", logging_strategy="no",
        save_strategy="no", eval_strategy="no", report_to="none", dataloader_drop_last=True, seed=42,
        disable_tqdm=True, use_cpu=not torch.cuda.is_available(), bf16=spec.get("precision") == "bf16")
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss, callbacks=[Timer()])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    seconds = stamps[-1] - stamps[warmup - 1] if warmup > 0 else stamps[-1] - stamps[0]
    timed = steps if warmup > 0 else steps - 1
    return {
        "steps": timed, "seconds": seconds, "steps_per_second": timed / seconds,
        "examples_per_second": timed * b / seconds, "sentences_per_second": timed * b / seconds,
        "fields_per_example": 1, "peak_rss_mib": _peak_rss_mib(), "cuda_peak_mib": _cuda_peak_mib(torch),
        "device": "cuda" if torch.cuda.is_available() else "cpu", "threads": torch.get_num_threads(),
        "optimizer": args.optim if isinstance(args.optim, str) else str(args.optim.value),
    }


CASES = {"method": method_case, "st-mnrl": st_mnrl_case}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    result = CASES[spec["kind"]](spec)
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

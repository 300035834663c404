"""One measured training case of ``raysent bench``, each in a fresh process of its own.

A fresh process per case keeps the cases from sharing caches, allocator state or threads, and makes
its peak resident memory (``ru_maxrss``) the case's own. Run as::

    python -m raysent.bench.cases '{"kind": "method", "config": {...}, "warmup": 5, "steps": 30}'

and it prints one line ``RESULT {json}``. The kinds:

* ``method``: a raysent method trained through :class:`raysent.train.loop.Stepper` (exactly the
  loop's optimizer step: the device's resolved settings, length buckets, views, gradient cache, AdamW,
  schedule), no evaluation;
* ``st-mnrl``: sentence-transformers' ``MultipleNegativesRankingLoss`` fitted with its
  ``SentenceTransformerTrainer`` on the same model, sentences, batch size and sequence length, each
  sentence its own positive (the unsupervised-SimCSE recipe of sentence-transformers' docs);
* ``profile-method`` and ``profile-st-mnrl``: the same two under torch.profiler (:mod:`raysent.bench.profile`);
* the search part's ways, ``raysent-search`` and ``st-hpsearch``, are in :mod:`raysent.bench.search_cases`.

The first two time ``steps`` optimizer steps after ``warmup`` untimed ones, data loading included; the device is
waited for only where the timing starts and ends (a step returns its loss on the device). Both also report what
the model FLOPs need (:func:`raysent.bench.runner.model_flops_per_step`): the encoder's shape and the real tokens
it encodes per step (raysent: counted on the timed batches, times the rows the method encodes per batch row in
its first, untimed step; sentence-transformers: from its sentences, as its tokenizer truncates them).
"""

from __future__ import annotations

import contextlib
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


def encoder_shape(model) -> dict:
    """What the MFU needs of a Hugging Face encoder: N, its parameters outside the embeddings and the pooler (the
    weights every token goes through), and its layers L, heads H and head size Q (None where its config lacks one)."""
    cfg = model.config
    layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
    n = sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name and "pooler" not in name)
    return {"encoder_params_non_embedding": n, "encoder_layers": layers, "attention_heads": heads,
            "head_dim": head_dim}


def token_counts(masks: list, steps: int) -> tuple[float, float]:
    """Per step, ΣT and ΣT² over the rows of the given attention masks (T: a row's real tokens)."""
    lengths = [m.sum(dim=1).double() for m in masks]
    return (sum(float(t.sum()) for t in lengths) / steps, sum(float((t * t).sum()) for t in lengths) / steps)


@contextlib.contextmanager
def count_encoder_rows(encoder):
    """Rows that go through ``encoder`` (a raysent Encoder) with gradients while the block runs: read from the
    shapes of its inputs, never their values, so nothing waits on the device."""
    import torch

    seen = {"rows": 0}

    def hook(module, args, kwargs):
        if torch.is_grad_enabled():
            x = kwargs.get("attention_mask", kwargs.get("input_ids"))
            if x is None and args:
                x = args[0]
            if isinstance(x, torch.Tensor):
                seen["rows"] += int(x.shape[0])

    handle = encoder.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _masks(batch: dict) -> list:
    return [v["attention_mask"] for v in batch.values() if isinstance(v, dict) and "attention_mask" in v]


class MethodRun:
    """A raysent method ready to train ``total`` steps as the loop does (:class:`raysent.train.loop.Stepper`, the
    device's resolved settings, the batches in the loop's order), no evaluation."""

    def __init__(self, spec: dict, total: int, scratch: str):
        import torch

        from raysent.data.batching import GlobalBatches
        from raysent.train.loop import Stepper, TrainHooks, build_optimizer, compile_widths, set_seed
        from raysent.train.run import build_method, prepare_data

        if spec.get("threads"):
            torch.set_num_threads(int(spec["threads"]))
        cfg = parse_config(spec["config"], source="<raysent bench>")
        self.cfg = cfg
        method = build_method(cfg)
        data, groups, self.info = prepare_data(cfg, method)
        hooks = TrainHooks(scratch, quiet=True)
        set_seed(cfg.train.seed)
        method.to(hooks.device)
        optimizer, scheduler = build_optimizer(cfg, method, total)
        self.stepper = Stepper(cfg, method, hooks, optimizer, scheduler)
        self.settings = self.stepper.settings
        if self.settings.compile:  # as the loop pads under train.compile: a few fixed widths
            data.pad_widths = compile_widths(data.max_length)
        started = time.perf_counter()
        self.prepared = method.prepare(data, hooks.device)
        self.prepare_seconds = time.perf_counter() - started
        order = GlobalBatches(len(data), cfg.train.batch_size, seed=cfg.train.seed, groups=groups)
        self.batches = [b for epoch in range(total // max(len(order), 1) + 1) for b in order.epoch(epoch)][:total]
        self.method, self.data, self.hooks = method, data, hooks
        method.train()

    def record(self) -> dict:
        import torch

        return {"device": self.hooks.device.type, "precision": self.stepper.precision,
                "settings": self.settings.record(), "threads": torch.get_num_threads(),
                "float32_matmul_precision": torch.get_float32_matmul_precision(), "data": self.info["source"],
                "attention": self.method.encoder.attention}


def method_case(spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="raysent-bench-") as scratch:
        return _method_case(spec, scratch)


def _method_case(spec: dict, scratch: str) -> dict:
    import torch

    from raysent.train.loop import device_batches

    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    run = MethodRun(spec, warmup + steps, scratch)
    stepper, data = run.stepper, run.data
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    masks: list = []
    loss = None
    rows_in, rows_encoded = 0, 0
    t0 = time.perf_counter()
    # the loop's own loader: collated on the host, pinned and copied without blocking on CUDA
    warmup_seconds = 0.0
    for i, batch in enumerate(device_batches(data, run.batches, run.hooks.device)):
        if i == warmup:
            _sync(torch)
            warmup_seconds = time.perf_counter() - t0  # a compile included (train.compile)
            t0 = time.perf_counter()
        if i >= warmup:
            masks.append(_masks(batch))  # counted after the timed steps
        if i == 0:  # untimed: how many rows the method encodes per row of its batch (two views, a triplet's three)
            with count_encoder_rows(run.method.encoder) as seen:
                loss = stepper.step(batch, i)
            rows_in, rows_encoded = sum(int(m.shape[0]) for m in _masks(batch)), seen["rows"]
        else:
            loss = stepper.step(batch, i)  # the loss stays on the device: read after the timing
    _sync(torch)
    seconds = time.perf_counter() - t0
    b = run.cfg.train.batch_size
    fields = len(data.ids)
    tokens, tokens_sq = token_counts([m for ms in masks for m in ms], steps)
    passes = rows_encoded / rows_in if rows_in and rows_encoded else None
    return {
        "steps": steps, "seconds": seconds, "steps_per_second": steps / seconds,
        "examples_per_second": steps * b / seconds, "sentences_per_second": steps * b * fields / seconds,
        "fields_per_example": fields, "real_tokens_per_step": tokens,
        **encoder_shape(run.method.encoder.model),
        "encoder_passes": passes,
        "encoder_tokens_per_step": tokens * passes if passes else None,
        "encoder_tokens_sq_per_step": tokens_sq * passes if passes else None,
        "peak_rss_mib": _peak_rss_mib(), "cuda_peak_mib": _cuda_peak_mib(torch), **run.record(),
        "prepare": run.prepared, "prepare_seconds": run.prepare_seconds,
        "last_loss": float(loss) if loss is not None else None,
        "warmup_seconds": warmup_seconds,
        # what the warm-up took beyond its steps at the timed rate: the compile, dynamo's trace and (CUDA graphs)
        # the recording of each graph
        "compile_seconds": (max(warmup_seconds - warmup * seconds / steps, 0.0) if run.settings.compile else None),
    }


class StRun:
    """sentence-transformers' MultipleNegativesRankingLoss ready to be fitted by its SentenceTransformerTrainer
    for ``total`` steps on the bench's sentences (each its own positive), with ``callbacks``."""

    def __init__(self, spec: dict, total: int, scratch: str, callbacks: list):
        import numpy as np
        import torch
        from datasets import Dataset
        from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
        from sentence_transformers import SentenceTransformerTrainingArguments as Arguments
        from sentence_transformers.losses import MultipleNegativesRankingLoss
        from transformers import PreTrainedModel

        from raysent.models.encoder import attention_implementation
        from raysent.models.locate import resolve_model
        from raysent.train.device import auto_precision

        if spec.get("threads"):
            torch.set_num_threads(int(spec["threads"]))
        b = int(spec["batch_size"])
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        precision = spec.get("precision", "auto")
        self.precision = auto_precision(self.device) if precision == "auto" else precision
        path, _ = resolve_model(spec["model"])
        model = SentenceTransformer(path, device=self.device)
        model.max_seq_length = int(spec["max_length"])
        sentences = list(load(spec["data"], "sentences").sentences())[: b * total]
        if len(sentences) < b * total:
            raise RuntimeError(f"{spec['data']}: {len(sentences)} sentences, {b * total} needed")
        train = Dataset.from_dict({"anchor": sentences, "positive": sentences})
        loss = MultipleNegativesRankingLoss(model, scale=1.0 / float(spec["temperature"]))
        self.args = Arguments(
            output_dir=scratch, per_device_train_batch_size=b, max_steps=total,
            learning_rate=float(spec["lr"]), warmup_ratio=0.0, lr_scheduler_type="linear", logging_strategy="no",
            save_strategy="no", eval_strategy="no", report_to="none", dataloader_drop_last=True, seed=42,
            disable_tqdm=True, use_cpu=self.device == "cpu", bf16=self.precision == "bf16")
        self.trainer = SentenceTransformerTrainer(model=model, args=self.args, train_dataset=train, loss=loss,
                                                  callbacks=callbacks)
        # the real tokens of its sentences, as its tokenizer truncates them: every sentence is used once (drop_last,
        # one epoch), so a step's mean is the mean over all of them; each text column is encoded once
        lens = np.asarray([len(ids) for ids in model.tokenizer(sentences, truncation=True,
                                                                max_length=model.max_seq_length)["input_ids"]],
                          dtype=np.float64)
        passes = len(train.column_names)
        hf = next(m for m in model.modules() if isinstance(m, PreTrainedModel))
        self.attention = attention_implementation(hf)
        self.counts = {"real_tokens_per_step": b * float(lens.mean()), **encoder_shape(hf),
                       "encoder_passes": float(passes),
                       "encoder_tokens_per_step": passes * b * float(lens.mean()),
                       "encoder_tokens_sq_per_step": passes * b * float((lens * lens).mean())}

    def record(self) -> dict:
        import torch

        args = self.args
        return {"device": self.device, "precision": self.precision, "attention": self.attention,
                "threads": torch.get_num_threads(),
                "float32_matmul_precision": torch.get_float32_matmul_precision(),
                "optimizer": args.optim if isinstance(args.optim, str) else str(args.optim.value)}


def st_mnrl_case(spec: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="raysent-bench-st-") as scratch:
        return _st_mnrl_case(spec, scratch)


def _st_mnrl_case(spec: dict, scratch: str) -> dict:
    import torch
    from transformers import TrainerCallback

    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    total = warmup + steps
    b = int(spec["batch_size"])
    stamps: dict[int, float] = {}

    class Timer(TrainerCallback):
        """The times after step ``warmup`` and after the last, the device waited for there only (as raysent's
        case does): a wait at every step would keep the host from running ahead."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (warmup, total):
                _sync(torch)
                stamps[state.global_step] = time.perf_counter()

    run = StRun(spec, total, scratch, [Timer()])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    run.trainer.train()
    seconds = stamps[total] - stamps[warmup]
    return {
        "steps": steps, "seconds": seconds, "steps_per_second": steps / seconds,
        "examples_per_second": steps * b / seconds, "sentences_per_second": steps * b / seconds,
        "fields_per_example": 1, **run.counts, "peak_rss_mib": _peak_rss_mib(), "cuda_peak_mib": _cuda_peak_mib(torch),
        **run.record(),
    }


def profile_method_case(spec: dict) -> dict:
    """raysent's side of the profile part: ``warmup`` + 1 + ``steps`` steps of the Stepper, the last ``steps``
    recorded (:mod:`raysent.bench.profile`)."""
    from raysent.bench.profile import profiler, summarize
    from raysent.train.loop import device_batches

    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    with tempfile.TemporaryDirectory(prefix="raysent-bench-profile-") as scratch:
        run = MethodRun(spec, warmup + 1 + steps, scratch)
        with profiler(warmup, steps) as prof:
            for i, batch in enumerate(device_batches(run.data, run.batches, run.hooks.device)):
                run.stepper.step(batch, i)
                prof.step()
        return {**summarize(prof.events()), **run.record()}


def profile_st_mnrl_case(spec: dict) -> dict:
    """sentence-transformers' side: its Trainer for ``warmup`` + 1 + ``steps`` steps, a callback stepping the
    profiler after each."""
    from transformers import TrainerCallback

    from raysent.bench.profile import profiler, summarize

    warmup, steps = int(spec["warmup"]), int(spec["steps"])
    prof = profiler(warmup, steps)

    class Step(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            prof.step()

    with tempfile.TemporaryDirectory(prefix="raysent-bench-profile-st-") as scratch:
        run = StRun(spec, warmup + 1 + steps, scratch, [Step()])
        with prof:
            run.trainer.train()
        return {**summarize(prof.events()), **run.record()}


CASES = {"method": method_case, "st-mnrl": st_mnrl_case, "profile-method": profile_method_case,
         "profile-st-mnrl": profile_st_mnrl_case}


def main(argv: list[str] | None = None, cases: dict | None = None) -> int:
    """Run the case ``argv[0]`` (its spec, JSON) names by ``kind``, of ``cases`` (these; the search part's are in
    :mod:`raysent.bench.search_cases`), and print its ``RESULT`` line."""
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0])
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    result = (CASES if cases is None else cases)[spec["kind"]](spec)
    print(RESULT_PREFIX + json.dumps(result, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

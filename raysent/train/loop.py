"""The training loop: one function of (config, method, data, hooks) for every method.

``run_training`` is the whole loop: AdamW, linear schedule with warmup, gradient clipping,
autocast (``train.precision``: bf16 on CPU and CUDA, fp16 on CUDA), dev evaluation every
``train.eval_every`` steps (and at step 0 and at the end), the best model exported with
``save_pretrained`` whenever the dev score improves, patience, resumable checkpoints. It does not
know whether it runs in this process (:class:`TrainHooks`) or on one of N Ray Train workers
(raysent.train.ray_train.RayHooks): everything that differs (devices, gathering negatives across
workers, where checkpoints go, how metrics are reported) goes through the ``hooks`` object.

A checkpoint is a folder with ``state.pt`` (model, optimizer, scheduler, step, the RNG states of
every worker, the best dev score so far, the dev curve) and ``best/`` (the best model so far, an
HF folder), so resuming from it continues exactly where the run was, and nothing is lost when a
worker or the whole run dies.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysent.config import ExperimentConfig
from raysent.data import load
from raysent.data.batching import GlobalBatches, TokenizedData, local_part
from raysent.errors import RaysentError
from raysent.eval.sts import evaluate_dev
from raysent.methods import Gatherer, Method
from raysent.methods.base import Speedups
from raysent.methods.card import write_card
from raysent.models.embedder import Embedder
from raysent.train.records import TrainSummary

# Lazy imports: transformers (heavy, and only the functions that need them import them).

log = logging.getLogger("raysent.train")

STATE_FILE = "state.pt"
BEST_DIR = "best"


class NonFiniteLossError(RaysentError):
    """The loss became NaN or infinite (a diverging configuration, e.g. too high a learning rate)."""


# --------------------------------------------------------------------------- hooks
class TrainHooks:
    """How the loop meets the outside world. This base is one worker in this process."""

    rank = 0
    world_size = 1
    paused = 0.0  # seconds this loop waited on others (a seed of raysent.tune.seeds), left out of its training time

    def __init__(self, output_dir: str | Path, resume: bool = False, quiet: bool = False):
        self.output_dir = Path(output_dir)
        self.resume = resume
        self.quiet = quiet
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    # distributed pieces (identity on one worker)
    def gatherer(self) -> Gatherer:
        return Gatherer()

    def wrap(self, method: Method, ddp: bool = True) -> torch.nn.Module:
        """The module the loop calls: DDP around the method on many workers (``ddp=False``: the method
        itself, its gradients then averaged by :meth:`sync_gradients`)."""
        return method

    def sync_gradients(self, method: Method) -> None:
        """Average the gradients over the workers when DDP does not (gradient caching)."""

    def broadcast(self, obj: Any) -> Any:
        return obj

    def all_gather_object(self, obj: Any) -> list:
        return [obj]

    def mean_across(self, value: float) -> float:
        return value

    # where checkpoints go
    restored_from: str | None = None  # the checkpoint restore_dir found (its own path or URI, not a local copy)

    def restore_dir(self) -> Path | None:
        ckpt = self.output_dir / "checkpoint"
        if self.resume and (ckpt / STATE_FILE).is_file():
            self.restored_from = str(ckpt)
            return ckpt
        return None

    def scratch_dir(self) -> Path:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        return self.output_dir

    def report(self, metrics: dict, checkpoint_dir: Path | None) -> None:
        """Keep the newest checkpoint in <output_dir>/checkpoint (replaced atomically)."""
        if checkpoint_dir is not None:
            final = self.output_dir / "checkpoint"
            old = self.output_dir / ".checkpoint.old"
            if final.exists():
                final.rename(old)
            Path(checkpoint_dir).rename(final)
            shutil.rmtree(old, ignore_errors=True)
        if "dev_spearman" in metrics and not metrics.get("finished"):
            self.log(format_eval(metrics))

    def finish(self, metrics: dict, summary: TrainSummary) -> None:
        """The run is over: report the final metrics (the caller writes result.json)."""
        self.report(metrics, None)

    def log(self, msg: str) -> None:
        if self.rank == 0 and not self.quiet:
            print(msg, file=sys.stderr, flush=True)


def format_eval(m: dict) -> str:
    """One evaluation as the progress line shows it (step, dev, best so far, loss)."""
    parts = [f"step {m['step']}", f"dev {m['dev_spearman']:.2f}", f"best {m['best_dev_spearman']:.2f} "
             f"(step {m['best_step']})"]
    if m.get("loss") is not None and math.isfinite(m["loss"]):
        parts.append(f"loss {m['loss']:.4f}")
    return "[eval] " + ", ".join(parts)


# --------------------------------------------------------------------------- state
@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    best_score: float = -math.inf
    best_step: int = -1
    evals_since_best: int = 0
    dev_curve: list[dict] = field(default_factory=list)
    loss_curve: list[dict] = field(default_factory=list)
    initial_dev: dict | None = None
    train_seconds: float = 0.0
    stopped_early: bool = False


def set_seed(seed: int, rank: int = 0) -> None:
    """Seed python, numpy and torch; each worker gets its own stream (seed, rank)."""
    s = seed * 1000 + rank
    random.seed(s)
    np.random.seed(s % (2**32))
    torch.manual_seed(s)  # every device's generator, CUDA's included


def rng_state() -> dict:
    """The state of every generator training draws from (python, numpy, torch, CUDA)."""
    st = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])


def link_tree(src: Path, dst: Path) -> None:
    """Copy a folder using hard links where the filesystem allows (checkpoints stay cheap)."""
    def link(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)
    shutil.copytree(src, dst, copy_function=link)


# --------------------------------------------------------------------------- optimizer
def build_optimizer(cfg: ExperimentConfig, method: Method,
                    total_steps: int) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    from transformers import get_linear_schedule_with_warmup

    t = cfg.train
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, p in method.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if (name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name) else decay).append(p)
    groups: list[dict[str, Any]] = [{"params": decay, "weight_decay": t.weight_decay},
                                    {"params": no_decay, "weight_decay": 0.0}]
    # fused: one kernel for every parameter (CPU and CUDA), the same update as the loop over parameters up to
    # float rounding and several times faster on a small model (raysent bench)
    fused = t.fused_adamw and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                                  for g in groups for p in g["params"])
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=t.lr, betas=t.adam_betas, eps=t.adam_eps,
                            **({"fused": True} if fused else {}))
    sched = get_linear_schedule_with_warmup(opt, int(round(t.warmup_ratio * total_steps)), max(total_steps, 1))
    return opt, sched


# --------------------------------------------------------------------------- the loop
def run_training(cfg: ExperimentConfig, method: Method, data: TokenizedData, dev_specs: list[str],
                 hooks: TrainHooks, groups: np.ndarray | None = None, record: dict | None = None) -> TrainSummary:
    """Train ``method`` on ``data``; returns the run summary (also written to result.json on rank 0).

    ``record`` is merged into the summary (e.g. a description of the data).
    """
    t = cfg.train
    set_seed(t.seed, hooks.rank)
    device = hooks.device
    method.to(device)
    method.set_gatherer(hooks.gatherer())
    world = hooks.world_size
    if t.batch_size % world:
        raise RaysentError(f"train.batch_size {t.batch_size} does not split evenly over {world} workers")
    lengths = data.lengths() if t.bucket_by_length else None
    batches = GlobalBatches(len(data), t.batch_size, seed=t.seed, groups=groups, bucket_lengths=lengths)
    steps_per_epoch = len(batches)
    total = steps_per_epoch * t.epochs
    if t.max_steps is not None:
        total = min(total, t.max_steps)
    if not method.trains:
        total = 0
    optimizer, scheduler = build_optimizer(cfg, method, total) if method.trains else (None, None)
    stepper = Stepper(cfg, method, hooks, optimizer, scheduler)
    model, scaler = stepper.model, stepper.scaler
    if stepper.precision != t.precision:
        hooks.log(f"NOTE: train.precision={t.precision} is not available on {device.type} (bf16: CPU and CUDA; "
                  f"fp16, with its GradScaler: CUDA only); this run trains in {stepper.precision} (precision: "
                  f"{stepper.precision} in the result)")

    scratch = hooks.scratch_dir() if hooks.rank == 0 else None
    best_dir = (scratch / BEST_DIR) if scratch is not None else None
    state = TrainState()
    restored = hooks.restore_dir()
    resumed_at = None
    if restored is not None:
        ckpt = torch.load(restored / STATE_FILE, map_location=device, weights_only=False)
        method.load_state_dict(ckpt["method"])
        if optimizer is not None and scheduler is not None:
            optimizer.load_state_dict(ckpt["optimizer"])
            scheduler.load_state_dict(ckpt["scheduler"])
        if scaler is not None and ckpt.get("scaler"):
            scaler.load_state_dict(ckpt["scaler"])
        state = TrainState(**ckpt["state"])
        set_rng_state(ckpt["rng"][hooks.rank])
        if (scratch is not None and best_dir is not None and (restored / BEST_DIR).is_dir()
                and restored.resolve() != scratch.resolve()):
            shutil.rmtree(best_dir, ignore_errors=True)
            link_tree(restored / BEST_DIR, best_dir)
        hooks.log(f"resumed from {hooks.restored_from} at step {state.step} (best dev {state.best_score:.2f} at "
                  f"step {state.best_step})")
        resumed_at = state.step

    dev_sets = None
    if hooks.rank == 0:
        dev_sets = {s: load(s, "scored_pairs") for s in dev_specs}
    embedder = Embedder(method.embed, method.encoder.tokenizer, module=method, max_length=cfg.eval.max_length,
                        batch_size=cfg.eval.batch_size, device=device)

    # where the time of this process goes (this run only, not a resumed run's earlier part): the bench's breakdown
    phases = {"eval_seconds": 0.0, "checkpoint_seconds": 0.0, "report_seconds": 0.0}

    def evaluate() -> dict:
        """The dev scores: computed on rank 0, the same on every worker."""
        t0 = time.perf_counter()
        scores: dict = hooks.broadcast(evaluate_dev(embedder, sets=dev_sets) if hooks.rank == 0 else None)
        phases["eval_seconds"] += time.perf_counter() - t0
        return scores

    def current_lr() -> float:
        return float(scheduler.get_last_lr()[0]) if scheduler is not None else 0.0

    def checkpoint_and_report(metrics: dict, improved: bool) -> None:
        t0 = time.perf_counter()
        rng = hooks.all_gather_object(rng_state())
        ckpt_dir = None
        if scratch is not None and best_dir is not None:  # rank 0
            if improved:
                tmp_best = Path(tempfile.mkdtemp(dir=scratch, prefix=".best-"))
                method.export(tmp_best, extra={"dev_spearman": state.best_score, "step": state.step,
                                               "config": cfg.to_dict(), "data": (record or {}).get("data")},
                              max_length=cfg.eval.max_length)
                write_card(tmp_best)
                shutil.rmtree(best_dir, ignore_errors=True)
                tmp_best.rename(best_dir)
            ckpt_dir = Path(tempfile.mkdtemp(dir=scratch, prefix=".ckpt-"))
            torch.save({
                "method": method.state_dict(),
                "optimizer": optimizer.state_dict() if optimizer is not None else None,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "state": asdict(state),
                "rng": rng,
            }, ckpt_dir / STATE_FILE)
            if best_dir.is_dir():
                link_tree(best_dir, ckpt_dir / BEST_DIR)
        t1 = time.perf_counter()
        hooks.report(metrics, ckpt_dir)
        phases["checkpoint_seconds"] += t1 - t0
        phases["report_seconds"] += time.perf_counter() - t1

    def eval_step(loss_avg: float | None) -> bool:
        """Evaluate, keep the best, checkpoint, report; True when patience says stop."""
        scores = evaluate()
        score = scores["dev_spearman"]
        improved = score > state.best_score
        if improved:
            state.best_score, state.best_step, state.evals_since_best = score, state.step, 0
        else:
            state.evals_since_best += 1
        state.dev_curve.append({"step": state.step, **scores})
        if state.step == 0 and state.initial_dev is None:
            state.initial_dev = scores
        # ("finished", not "done": Tune reads a reported "done" as the end of the trial)
        metrics = {"step": state.step, "epoch": state.epoch, "loss": loss_avg,
                   "lr": current_lr(), **scores,
                   "best_dev_spearman": state.best_score, "best_step": state.best_step, "finished": False}
        stop = t.patience is not None and state.evals_since_best >= t.patience
        checkpoint_and_report(metrics, improved)
        return stop

    hooks.log(f"training {method.name} on {len(data):,} examples: {total} steps of {t.batch_size} "
              f"({steps_per_epoch} per epoch) on {world} worker(s), device {device.type}")
    prepared = method.prepare(data, device, hooks.log) if total > state.step else {}
    model.train()
    if state.step == 0 and not state.dev_curve and (t.eval_at_start or total == 0):
        eval_step(None)

    run_start = time.perf_counter() - state.train_seconds
    window_loss, window_n = 0.0, 0  # since the last evaluation
    log_loss, log_n = 0.0, 0  # since the last progress line
    stop = state.stopped_early
    while state.step < total and not stop:
        epoch_batches = batches.epoch(state.epoch)
        while state.batch_in_epoch < len(epoch_batches) and state.step < total and not stop:
            idx = local_part(epoch_batches[state.batch_in_epoch], hooks.rank, world)
            loss = stepper.step(data.collate(idx), state.step)
            state.step += 1
            state.batch_in_epoch += 1
            epoch_done = state.batch_in_epoch >= len(epoch_batches)
            if epoch_done:  # a checkpoint taken now resumes at the start of the next epoch
                state.epoch += 1
                state.batch_in_epoch = 0
            loss_value = loss
            window_loss, window_n = window_loss + loss_value, window_n + 1
            log_loss, log_n = log_loss + loss_value, log_n + 1
            if state.step % t.log_every == 0:
                state.loss_curve.append({"step": state.step, "loss": log_loss / log_n})
                elapsed = time.perf_counter() - run_start - hooks.paused
                rate = state.step / max(elapsed, 1e-9)
                eta = (total - state.step) / max(rate, 1e-9)
                hooks.log(f"step {state.step}/{total}  loss {log_loss / log_n:.4f}  "
                          f"lr {current_lr():.2e}  {rate:.2f} steps/s  eta {eta / 60:.1f} min")
                log_loss, log_n = 0.0, 0
            if state.step % t.eval_every == 0 or state.step == total:
                state.train_seconds = time.perf_counter() - run_start - hooks.paused
                loss_avg = hooks.mean_across(window_loss / max(window_n, 1))
                window_loss, window_n = 0.0, 0
                if eval_step(loss_avg):
                    state.stopped_early = stop = True
                    hooks.log(f"early stop: no new best dev score in {t.patience} evaluations")
            if epoch_done:
                break
    state.train_seconds = time.perf_counter() - run_start - hooks.paused
    summary = TrainSummary(
        method=method.name,
        best_dev_spearman=state.best_score,
        best_step=state.best_step,
        final_step=state.step,
        total_steps=total,
        stopped_early=state.stopped_early,
        resumed_at_step=resumed_at,
        resumed_from=hooks.restored_from if resumed_at is not None else None,
        initial_dev=state.initial_dev,
        dev_curve=state.dev_curve,
        loss_curve=state.loss_curve,
        train_seconds=state.train_seconds,
        steps_per_second=state.step / state.train_seconds if state.train_seconds > 0 else None,
        sentences_per_second=(state.step * t.batch_size / state.train_seconds) if state.train_seconds > 0 else None,
        workers=world,
        device=device.type,
        torch_threads=torch.get_num_threads(),
        precision=stepper.precision,
        prepare=prepared,
        phases={k: round(v, 3) for k, v in phases.items()},
        best_model_dir=str(best_dir) if hooks.rank == 0 else None,
        **(record or {}),
    )
    final = {"step": state.step, "epoch": state.epoch, "best_dev_spearman": state.best_score,
             "best_step": state.best_step, "finished": True,
             **(state.dev_curve[-1] if state.dev_curve else {})}
    final.pop("step", None)
    hooks.finish({"step": state.step, **final}, summary)
    return summary


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def used_precision(precision: str, device_type: str) -> str:
    """What ``train.precision`` trains in on a device: bf16 wherever torch autocasts (CPU and CUDA run the same
    code: tests/train/test_precision.py), fp16 on CUDA only, fp32 otherwise (logged, and recorded in the run).

    fp16 stays on CUDA: it needs loss scaling (GradScaler), and what it is for (the fp16 tensor cores of GPUs
    without bf16) a CPU does not have; bf16 keeps fp32's exponent and needs no scaling."""
    if precision == "bf16" and torch.amp.is_autocast_available(device_type):
        return "bf16"
    if precision == "fp16" and device_type == "cuda":
        return "fp16"
    return "fp32"


def autocast(precision: str, device: torch.device):
    """The autocast context every forward pass of a step runs in, for ``train.precision`` on ``device``."""
    used = used_precision(precision, device.type)
    return torch.autocast(device.type, dtype=AMP_DTYPES.get(used, torch.bfloat16), enabled=used != "fp32")


class Stepper:
    """One optimizer step of the loop, from a collated batch: forward and backward (through the length
    buckets and gradient cache of ``train``), gradient clipping, AdamW, the schedule. ``raysent bench``
    times exactly this."""

    def __init__(self, cfg: ExperimentConfig, method: Method, hooks: TrainHooks, optimizer, scheduler):
        t = cfg.train
        self.method, self.hooks, self.optimizer, self.scheduler = method, hooks, optimizer, scheduler
        self.grad_clip = t.grad_clip
        self.device = hooks.device
        # speedups that keep the loss and gradients (tests/train/test_speedups.py); grad caching runs several backward
        # passes per step, which DDP cannot follow: the gradients are then averaged by hooks.sync_gradients
        method.speedups = Speedups(concat_views=t.concat_views, cache_views=t.cache_views)
        method.encoder.length_buckets = t.length_buckets
        self.grad_cache = t.grad_cache_rows if method.trains else None
        if self.grad_cache and not method.supports_grad_cache:
            raise RaysentError(f"train.grad_cache_rows: method {method.name} does not support gradient caching")
        self.model = hooks.wrap(method, ddp=not self.grad_cache)
        self.train_precision = t.precision
        self.precision = used_precision(t.precision, self.device.type)  # what the run records
        # CUDA only (docs/performance.md, "bf16 without a GPU"): fp16 needs loss scaling, bf16 does not
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None

    def autocast(self):
        """Mixed precision around the forward passes only (backward runs outside it, as PyTorch advises)."""
        return autocast(self.train_precision, self.device)

    def step(self, batch: dict, step: int) -> float:
        """Train on one collated batch; returns its loss."""
        batch = _to_device(batch, self.device)
        opt, scaler = self.optimizer, self.scaler
        opt.zero_grad(set_to_none=True)
        loss = forward_backward(self.model, self.method, batch, scaler, self.grad_cache, step,
                                self.scheduler.get_last_lr()[0], autocast=self.autocast)
        if self.grad_cache:
            self.hooks.sync_gradients(self.method)
        if scaler is not None:
            scaler.unscale_(opt)
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.method.trainable_parameters(), self.grad_clip)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        self.scheduler.step()
        return float(loss.detach())


def forward_backward(model: torch.nn.Module, method: Method, batch: dict, scaler=None, grad_cache: int | None = None,
                     step: int = 0, lr: float = 0.0, autocast=contextlib.nullcontext) -> torch.Tensor:
    """One batch's loss and its gradients (accumulated into ``.grad``); through a gradient cache of
    ``grad_cache`` rows per chunk when given (raysent.models.chunked.GradCache). ``autocast()`` wraps
    every forward pass."""
    def backward(loss: torch.Tensor) -> None:
        if not torch.isfinite(loss.detach()):
            raise NonFiniteLossError(
                f"the loss became {loss.item()} at step {step + 1} (lr {lr:.2e}); "
                "the configuration diverges: lower the learning rate or raise the temperature")
        (scaler.scale(loss) if scaler is not None else loss).backward()

    if not grad_cache:
        with autocast():
            loss = model(batch).loss
        backward(loss)
        return loss
    with method.encoder.grad_cache(grad_cache) as cache:
        with autocast():
            loss = model(batch).loss
        backward(loss)  # the method's own parameters, and the gradients of the cached hidden states
        cache.backward(autocast)  # into the encoder, chunk by chunk
    return loss


def _to_device(batch: dict, device: torch.device) -> dict:
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out[k] = {kk: vv.to(device, non_blocking=True) for kk, vv in v.items()}
        elif isinstance(v, torch.Tensor):
            out[k] = v.to(device, non_blocking=True)
        else:
            out[k] = v
    return out

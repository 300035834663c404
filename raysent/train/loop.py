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
import errno
import logging
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from raysent.config import ExperimentConfig
from raysent.data import load
from raysent.data.batching import GlobalBatches, TokenizedData, local_part
from raysent.data.datasets import check_scores_vary
from raysent.errors import RaysentError
from raysent.eval.sts import DEV_USE, evaluate_dev, nan_dev_sets
from raysent.io import is_disk_full
from raysent.methods import Gatherer, Method
from raysent.methods.base import Speedups
from raysent.methods.card import write_card
from raysent.models.embedder import Embedder
from raysent.train import initial_dev
from raysent.train.device import DeviceSettings, auto_precision, default_device
from raysent.train.device import resolve as resolve_settings
from raysent.train.records import TrainSummary

# Lazy imports: transformers (heavy, and only the functions that need them import them).

log = logging.getLogger("raysent.train")

STATE_FILE = "state.pt"
BEST_DIR = "best"


class NonFiniteLossError(RaysentError):
    """The loss became NaN or infinite (a diverging configuration, e.g. too high a learning rate)."""


class NaNDevScoreError(RaysentError):
    """The dev Spearman is NaN before any checkpoint was best: no checkpoint can be chosen, so the run would end
    without a best model (its search reporting ``-inf``, its final phase without a model to test)."""


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
        self.device = default_device()

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


def link_tree(src: Path, dst: Path, copy_below: int = 0) -> None:
    """Copy a folder using hard links where the filesystem allows (checkpoints stay cheap); files smaller than
    ``copy_below`` bytes are copied, so that rewriting one in ``dst`` leaves ``src``'s as it was."""
    def link(s, d):
        if os.path.getsize(s) >= copy_below:
            try:
                os.link(s, d)
                return
            except OSError:
                pass
        shutil.copy2(s, d)
    shutil.copytree(src, dst, copy_function=link)


# --------------------------------------------------------------------------- optimizer
def build_optimizer(cfg: ExperimentConfig, method: Method, total_steps: int, settings: DeviceSettings | None = None,
                    ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    from transformers import get_linear_schedule_with_warmup

    t = cfg.train
    settings = settings or resolve_settings(t, next(method.parameters()).device)
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
    fused = settings.fused_adamw and all(p.device.type in ("cpu", "cuda") and p.is_floating_point()
                                         for g in groups for p in g["params"])
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=t.lr, betas=t.adam_betas, eps=t.adam_eps,
                            **({"fused": True} if fused else {}))
    sched = get_linear_schedule_with_warmup(opt, int(round(t.warmup_ratio * total_steps)), max(total_steps, 1))
    return opt, sched


# --------------------------------------------------------------------------- the run
@dataclass
class Run:
    """What every part of one training run reads: built once by :func:`setup`, then passed to each function
    of the loop (:func:`restore`, :func:`fit`, :func:`validate`, :func:`save_checkpoint`, :func:`summarize`)."""

    cfg: ExperimentConfig
    method: Method
    data: TokenizedData
    hooks: TrainHooks
    settings: DeviceSettings
    stepper: Stepper
    batches: GlobalBatches
    total: int  # optimizer steps of the whole run
    steps_per_epoch: int
    dev_sets: dict | None  # rank 0 only
    embedder: Embedder
    record: dict[str, Any]
    scratch: Path | None  # rank 0 only: where the best model and checkpoints are written
    # where the time of this process goes (this run only, not a resumed run's earlier part): the bench's breakdown
    phases: dict[str, float] = field(default_factory=lambda: {"eval_seconds": 0.0, "checkpoint_seconds": 0.0,
                                                              "report_seconds": 0.0})

    @property
    def best_dir(self) -> Path | None:
        return self.scratch / BEST_DIR if self.scratch is not None else None


def setup(cfg: ExperimentConfig, method: Method, data: TokenizedData, dev_specs: list[str], hooks: TrainHooks,
          groups: np.ndarray | None = None, record: dict | None = None) -> Run:
    """Seed, move the method to the device, resolve the device's settings, order the batches and build the
    optimizer: everything a run needs before its first step."""
    t = cfg.train
    set_seed(t.seed, hooks.rank)
    device = hooks.device
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
    settings = resolve_settings(t, device, total_steps=total)  # compile: auto weighs the run's length
    method.to(device)
    method.set_gatherer(hooks.gatherer())
    optimizer, scheduler = build_optimizer(cfg, method, total, settings) if method.trains else (None, None)
    stepper = Stepper(cfg, method, hooks, optimizer, scheduler, settings=settings)
    data.pad_widths = compile_widths(data.max_length) if settings.compile else None
    hooks.log(settings.describe())
    if stepper.precision != settings.precision:
        hooks.log(f"NOTE: train.precision={t.precision} is not available on {device.type} (bf16: CPU and CUDA; "
                  f"fp16, with its GradScaler: CUDA only); this run trains in {stepper.precision} (precision: "
                  f"{stepper.precision} in the result)")
    dev_sets = {s: load(s, "scored_pairs") for s in dev_specs} if hooks.rank == 0 else None
    for dev in (dev_sets or {}).values():  # constant gold scores: refused before the first step, not at an eval
        check_scores_vary(dev, DEV_USE)
    embedder = Embedder(method.embed, method.encoder.tokenizer, module=method, max_length=cfg.eval.max_length,
                        batch_size=cfg.eval.batch_size, device=device)
    return Run(cfg=cfg, method=method, data=data, hooks=hooks, settings=settings, stepper=stepper, batches=batches,
               total=total, steps_per_epoch=steps_per_epoch, dev_sets=dev_sets, embedder=embedder,
               record=dict(record or {}), scratch=hooks.scratch_dir() if hooks.rank == 0 else None)


def restore(run: Run) -> tuple[TrainState, int | None]:
    """The state to start from: the checkpoint the hooks find (model, optimizer, schedule, scaler, RNG, best
    model), or a fresh one. Returns it and the step it resumed at (None: not resumed)."""
    hooks, method, stepper = run.hooks, run.method, run.stepper
    restored = hooks.restore_dir()
    if restored is None:
        return TrainState(), None
    ckpt = torch.load(restored / STATE_FILE, map_location=hooks.device, weights_only=False)
    method.load_state_dict(ckpt["method"])
    if stepper.optimizer is not None and stepper.scheduler is not None:
        stepper.optimizer.load_state_dict(ckpt["optimizer"])
        stepper.scheduler.load_state_dict(ckpt["scheduler"])
    if stepper.scaler is not None and ckpt.get("scaler"):
        stepper.scaler.load_state_dict(ckpt["scaler"])
    state = TrainState(**ckpt["state"])
    set_rng_state(ckpt["rng"][hooks.rank])
    best_dir = run.best_dir
    if (run.scratch is not None and best_dir is not None and (restored / BEST_DIR).is_dir()
            and restored.resolve() != run.scratch.resolve()):
        shutil.rmtree(best_dir, ignore_errors=True)
        link_tree(restored / BEST_DIR, best_dir)
    hooks.log(f"resumed from {hooks.restored_from} at step {state.step} (best dev {state.best_score:.2f} at "
              f"step {state.best_step})")
    return state, state.step


def validate(run: Run, initial: bool = False) -> dict:
    """The dev scores: computed on rank 0, the same on every worker. ``initial``: the untuned model's, which an
    earlier run with the same weights may have computed already (``train.eval_at_start_cache``,
    :mod:`raysent.train.initial_dev`)."""
    t0 = time.perf_counter()
    hooks = run.hooks
    scores: dict | None = None
    if hooks.rank == 0:
        def compute() -> dict:
            return evaluate_dev(run.embedder, sets=run.dev_sets)

        if initial and run.cfg.train.eval_at_start_cache and run.dev_sets is not None:
            e = run.embedder
            embedding = {"max_length": e.max_length, "batch_size": e.batch_size, "device": e.device.type}
            dev_sets = run.dev_sets
            scores = initial_dev.scores(compute, initial_dev.key(run.method.embeds_with(), embedding, dev_sets),
                                        hooks.log)
        else:
            scores = compute()
    scores = hooks.broadcast(scores)
    run.phases["eval_seconds"] += time.perf_counter() - t0
    return scores


def current_lr(run: Run) -> float:
    scheduler = run.stepper.scheduler
    return float(scheduler.get_last_lr()[0]) if scheduler is not None else 0.0


def _refuse_if_full(folder: Path, method, exc: Exception) -> None:
    """A checkpoint write that failed on a full disk as the error says so: torch.save reports it as "[enforce fail
    at inline_container.cc:672] . unexpected pos" (torch 2.13, seen on a 60 MB tmpfs), which names neither the disk
    nor the folder. The disk counts as full when less is free than the checkpoint takes (the weights and AdamW's
    two moments)."""
    need = 3 * sum(t.numel() * t.element_size() for t in method.state_dict().values() if torch.is_tensor(t))
    free = shutil.disk_usage(folder).free
    if free < need:
        raise OSError(errno.ENOSPC, f"No space left on device: a checkpoint in {folder} needs about {need / 1e6:.0f} "
                      f"MB, {free / 1e6:.0f} MB are free ({' '.join(str(exc).split())[:200]})") from exc


def save_checkpoint(run: Run, state: TrainState, metrics: dict, improved: bool) -> None:
    """Export the best model when it improved, write a resumable checkpoint (rank 0) and report ``metrics``."""
    t0 = time.perf_counter()
    hooks, method, stepper, cfg = run.hooks, run.method, run.stepper, run.cfg
    rng = hooks.all_gather_object(rng_state())
    ckpt_dir = None
    scratch, best_dir = run.scratch, run.best_dir
    if scratch is not None and best_dir is not None:  # rank 0
        tmp_best = None
        try:  # a failed write (a full disk) leaves no half-written folder behind
            if improved:
                tmp_best = Path(tempfile.mkdtemp(dir=scratch, prefix=".best-"))
                method.export(tmp_best, extra={"dev_spearman": state.best_score, "step": state.step,
                                               "config": cfg.to_dict(), "data": run.record.get("data")},
                              max_length=cfg.eval.max_length)
                write_card(tmp_best)
                shutil.rmtree(best_dir, ignore_errors=True)
                tmp_best.rename(best_dir)
                tmp_best = None
            ckpt_dir = Path(tempfile.mkdtemp(dir=scratch, prefix=".ckpt-"))
            torch.save({
                "method": method.state_dict(),
                "optimizer": stepper.optimizer.state_dict() if stepper.optimizer is not None else None,
                "scheduler": stepper.scheduler.state_dict() if stepper.scheduler is not None else None,
                "scaler": stepper.scaler.state_dict() if stepper.scaler is not None else None,
                "state": asdict(state),
                "rng": rng,
            }, ckpt_dir / STATE_FILE)
            if best_dir.is_dir():
                link_tree(best_dir, ckpt_dir / BEST_DIR)
        except BaseException as exc:
            for half in (tmp_best, ckpt_dir):
                if half is not None:
                    shutil.rmtree(half, ignore_errors=True)
            if isinstance(exc, Exception) and not is_disk_full(exc):
                _refuse_if_full(scratch, method, exc)
            raise
    t1 = time.perf_counter()
    hooks.report(metrics, ckpt_dir)
    run.phases["checkpoint_seconds"] += t1 - t0
    run.phases["report_seconds"] += time.perf_counter() - t1


def evaluate_and_save(run: Run, state: TrainState, loss_avg: float | None) -> bool:
    """Evaluate, keep the best, checkpoint, report; True when patience says stop."""
    scores = validate(run, initial=state.step == 0)
    score = scores["dev_spearman"]
    if math.isnan(score):
        nan_dev_score(run, state, scores)
    improved = score > state.best_score
    if improved:
        state.best_score, state.best_step, state.evals_since_best = score, state.step, 0
    else:
        state.evals_since_best += 1
    state.dev_curve.append({"step": state.step, **scores})
    if state.step == 0 and state.initial_dev is None:
        state.initial_dev = scores
    # ("finished", not "done": Tune reads a reported "done" as the end of the trial)
    metrics = {"step": state.step, "epoch": state.epoch, "loss": loss_avg, "lr": current_lr(run), **scores,
               "best_dev_spearman": state.best_score, "best_step": state.best_step, "finished": False}
    patience = run.cfg.train.patience
    stop = patience is not None and state.evals_since_best >= patience
    save_checkpoint(run, state, metrics, improved)
    return stop


def nan_dev_score(run: Run, state: TrainState, scores: dict) -> None:
    """A NaN dev Spearman: the model's cosines on a dev set are all equal or not numbers (constant gold scores are
    refused when the set is read). Before any checkpoint was best it is a :class:`NaNDevScoreError` naming the dev
    set: a run that has no best model would end with none. After one, the model collapsed: the best stays, loudly
    (a run whose last dev score is NaN is recorded as diverged)."""
    names = nan_dev_sets(scores) or ["the dev sets"]
    sources = {n: d.source for n, d in (run.dev_sets or {}).items()}
    which = ", ".join(f"{n} ({sources[n]})" if n in sources else n for n in names)
    why = (f"the dev Spearman on {which} is NaN at step {state.step}: the model gives every pair of it the same "
           "cosine, or one that is not a number (its sentence vectors do not vary: a collapsed model, or a pooling "
           "that reads the same vector for every sentence, such as layer 0's [CLS])")
    if state.best_score == -math.inf:
        raise NaNDevScoreError(f"{why}, so no checkpoint can be chosen as the best. Fix: another pooling, "
                               "a lower learning rate, or another model")
    run.hooks.log(f"WARNING: {why}; the best checkpoint stays the one of step {state.best_step} "
                  f"(dev {state.best_score:.2f})")


class LossMeter:
    """The running loss since the last progress line and since the last evaluation, summed on the device.

    Adding a step's loss is a kernel, not a host sync; the sums are read (one sync each) only at log and eval
    intervals, and a NaN or infinite loss is caught there: the loop never waits on the device in between
    (tests/train/test_host_syncs.py counts it)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.log_sum, self.log_n, self.log_from = torch.zeros((), dtype=torch.float64, device=device), 0, 0
        self.win_sum, self.win_n, self.win_from = torch.zeros((), dtype=torch.float64, device=device), 0, 0

    def add(self, loss: torch.Tensor) -> None:
        value = loss.detach().to(torch.float64)
        self.log_sum.add_(value)
        self.win_sum.add_(value)
        self.log_n += 1
        self.win_n += 1

    @staticmethod
    def _read(total: torch.Tensor, n: int, first: int, last: int, lr: float) -> float:
        mean = float(total) / max(n, 1)  # the one host sync of the interval
        if not math.isfinite(mean):
            raise NonFiniteLossError(
                f"the loss became {mean} between steps {first + 1} and {last} (lr {lr:.2e}); the configuration "
                "diverges: lower the learning rate or raise the temperature")
        return mean

    def read_log(self, step: int, lr: float) -> float:
        mean = self._read(self.log_sum, self.log_n, self.log_from, step, lr)
        self.log_sum.zero_()
        self.log_n, self.log_from = 0, step
        return mean

    def read_window(self, step: int, lr: float) -> float:
        mean = self._read(self.win_sum, self.win_n, self.win_from, step, lr)
        self.win_sum.zero_()
        self.win_n, self.win_from = 0, step
        return mean


def fit(run: Run, state: TrainState) -> None:
    """Train from ``state`` to the run's last step (or an early stop): the optimizer steps, with a progress
    line every ``train.log_every`` steps and an evaluation and checkpoint every ``train.eval_every``."""
    t, hooks, total = run.cfg.train, run.hooks, run.total
    run_start = time.perf_counter() - state.train_seconds
    meter = LossMeter(hooks.device)
    meter.log_from = meter.win_from = state.step
    stop = state.stopped_early
    while state.step < total and not stop:
        epoch = [local_part(b, hooks.rank, hooks.world_size) for b in run.batches.epoch(state.epoch)]
        stream = device_batches(run.data, epoch[state.batch_in_epoch:], hooks.device)
        for batch in stream:
            if state.step >= total or stop:
                break
            meter.add(run.stepper.step(batch, state.step))
            state.step += 1
            state.batch_in_epoch += 1
            epoch_done = state.batch_in_epoch >= len(epoch)
            if epoch_done:  # a checkpoint taken now resumes at the start of the next epoch
                state.epoch += 1
                state.batch_in_epoch = 0
            if state.step % t.log_every == 0:
                loss = meter.read_log(state.step, current_lr(run))
                state.loss_curve.append({"step": state.step, "loss": loss})
                elapsed = time.perf_counter() - run_start - hooks.paused
                rate = state.step / max(elapsed, 1e-9)
                eta = (total - state.step) / max(rate, 1e-9)
                hooks.log(f"step {state.step}/{total}  loss {loss:.4f}  lr {current_lr(run):.2e}  "
                          f"{rate:.2f} steps/s  eta {eta / 60:.1f} min")
            if state.step % t.eval_every == 0 or state.step == total:
                loss_avg = hooks.mean_across(meter.read_window(state.step, current_lr(run)))
                state.train_seconds = time.perf_counter() - run_start - hooks.paused
                if evaluate_and_save(run, state, loss_avg):
                    state.stopped_early = stop = True
                    hooks.log(f"early stop: no new best dev score in {t.patience} evaluations")
            if epoch_done:
                break
    state.train_seconds = time.perf_counter() - run_start - hooks.paused


def summarize(run: Run, state: TrainState, resumed_at: int | None, prepared: dict) -> TrainSummary:
    """The run's summary (the loop's part of result.json)."""
    t, hooks = run.cfg.train, run.hooks
    seconds = state.train_seconds
    return TrainSummary(
        method=run.method.name,
        best_dev_spearman=state.best_score,
        best_step=state.best_step,
        final_step=state.step,
        total_steps=run.total,
        stopped_early=state.stopped_early,
        resumed_at_step=resumed_at,
        resumed_from=hooks.restored_from if resumed_at is not None else None,
        initial_dev=state.initial_dev,
        dev_curve=state.dev_curve,
        loss_curve=state.loss_curve,
        train_seconds=seconds,
        steps_per_second=state.step / seconds if seconds > 0 else None,
        sentences_per_second=(state.step * t.batch_size / seconds) if seconds > 0 else None,
        workers=hooks.world_size,
        device=hooks.device.type,
        torch_threads=torch.get_num_threads(),
        precision=run.stepper.precision,
        settings=run.settings.record(),
        attention=run.method.encoder.attention,
        prepare=prepared,
        phases={k: round(v, 3) for k, v in run.phases.items()},
        best_model_dir=str(run.best_dir) if hooks.rank == 0 else None,
        sources=sources(run),
        **run.record,
    )


def sources(run: Run) -> dict[str, str]:
    """What the run read, as its record names it: the model (``hf://<repo>@<commit>`` from the hub, with the commit
    read), the training data and each dev set (rank 0's view)."""
    out = {"model": run.method.encoder.source_id}
    train = (run.record or {}).get("data", {}).get("source")
    if train:
        out["train"] = str(train)
    for spec, data in (run.dev_sets or {}).items():
        out[f"dev {spec}"] = data.source
    return out


def run_training(cfg: ExperimentConfig, method: Method, data: TokenizedData, dev_specs: list[str],
                 hooks: TrainHooks, groups: np.ndarray | None = None, record: dict | None = None) -> TrainSummary:
    """Train ``method`` on ``data``; returns the run summary (also written to result.json on rank 0).

    ``record`` is merged into the summary (e.g. a description of the data).
    """
    run = setup(cfg, method, data, dev_specs, hooks, groups=groups, record=record)
    state, resumed_at = restore(run)
    t = cfg.train
    hooks.log(f"training {method.name} on {len(data):,} examples: {run.total} steps of {t.batch_size} "
              f"({run.steps_per_epoch} per epoch) on {hooks.world_size} worker(s), device {hooks.device.type}")
    prepared = method.prepare(data, hooks.device, hooks.log) if run.total > state.step else {}
    method.train()
    if state.step == 0 and not state.dev_curve and (t.eval_at_start or run.total == 0):
        evaluate_and_save(run, state, None)
    fit(run, state)
    summary = summarize(run, state, resumed_at, prepared)
    final = {"epoch": state.epoch, "best_dev_spearman": state.best_score, "best_step": state.best_step,
             "finished": True, **(state.dev_curve[-1] if state.dev_curve else {})}
    final.pop("step", None)
    hooks.finish({"step": state.step, **final}, summary)
    return summary


# --------------------------------------------------------------------------- batches on the device
def compile_widths(max_length: int) -> tuple[int, ...]:
    """The few widths a batch is padded to under ``train.compile``: powers of two from 8, then ``max_length``,
    so the compiled graphs are reused (at most log2(max_length) shapes) instead of one per batch width."""
    widths = [w for w in (8, 16, 32, 64, 128, 256, 512, 1024, 2048) if w < max_length]
    return (*widths, max_length)


def device_batches(data: TokenizedData, batches: list[np.ndarray], device: torch.device) -> Iterator[dict]:
    """The collated batches of ``batches`` (row indices), on ``device``: a DataLoader that collates on the host
    (vectorised: :meth:`TokenizedData.collate`), pins the memory on CUDA, and copies without blocking, so the
    host prepares the next batch while the device computes."""
    from torch.utils.data import DataLoader

    # its own generator: a DataLoader draws its base seed from torch's global one at every iteration, which would
    # shift the dropout masks of the steps after it and make a resumed run differ from one that never stopped
    loader: DataLoader = DataLoader(
        batches,  # type: ignore[arg-type]  # a list serves as a map-style dataset (torch's hint asks for a Dataset)
        batch_size=None, shuffle=False, collate_fn=data.collate, pin_memory=device.type == "cuda", num_workers=0,
        generator=torch.Generator().manual_seed(0))
    for batch in loader:
        yield _to_device(batch, device)


AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def used_precision(precision: str, device_type: str) -> str:
    """What ``train.precision`` trains in on a device: bf16 wherever torch autocasts (CPU and CUDA run the same
    code: tests/train/test_precision.py), fp16 on CUDA only, fp32 otherwise (logged, and recorded in the run).

    fp16 stays on CUDA: it needs loss scaling (GradScaler), and what it is for (the fp16 tensor cores of GPUs
    without bf16) a CPU does not have; bf16 keeps fp32's exponent and needs no scaling."""
    if precision == "auto":
        precision = auto_precision(device_type)
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
    """One optimizer step of the loop, from a batch on the device: forward and backward (through the length
    buckets and gradient cache of ``train``), gradient clipping, AdamW, the schedule. ``raysent bench`` times
    exactly this. A step never waits on the device: it returns the loss as a tensor (the loop reads it at its
    log and eval intervals, :class:`LossMeter`)."""

    def __init__(self, cfg: ExperimentConfig, method: Method, hooks: TrainHooks, optimizer, scheduler,
                 settings: DeviceSettings | None = None):
        t = cfg.train
        self.method, self.hooks, self.optimizer, self.scheduler = method, hooks, optimizer, scheduler
        self.grad_clip = t.grad_clip
        self.device = hooks.device
        self.settings = settings or resolve_settings(t, self.device)
        # speedups that keep the loss and gradients (tests/train/test_speedups.py); grad caching runs several backward
        # passes per step, which DDP cannot follow: the gradients are then averaged by hooks.sync_gradients
        method.speedups = Speedups(concat_views=t.concat_views, cache_views=t.cache_views)
        method.encoder.length_buckets = self.settings.length_buckets
        if self.settings.compile:
            method.encoder.compile_for_training(self.settings.compile_mode or "default")
        # The optimizer step is not compiled. AdamW's fused implementation (fused_adamw, on by default) is already one
        # multi-tensor kernel launch for every parameter, and torch.compile does not trace into it: torch 2.13 wraps
        # every optimizer's _fused_* function in torch.compiler.disable ("don't trace into fused optimizer",
        # torch/_dynamo/eval_frame.py), so a compiled step runs the same kernel with a graph break around it. Compiling
        # the foreach implementation instead changes the update (inductor's kernels round differently: 2.4e-7 on the
        # weights of a 3-layer model after 6 steps, CPU, torch 2.13) and adds its own compile to every trial.
        self.cuda_graphs = self.settings.cuda_graphs
        self.grad_cache = t.grad_cache_rows if method.trains else None
        if self.grad_cache and not method.supports_grad_cache:
            raise RaysentError(f"train.grad_cache_rows: method {method.name} does not support gradient caching")
        self.model = hooks.wrap(method, ddp=not self.grad_cache)
        self.train_precision = self.settings.precision
        self.precision = used_precision(self.train_precision, self.device.type)  # what the run records
        # CUDA only (docs/performance.md, "bf16 without a GPU"): fp16 needs loss scaling, bf16 does not
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "fp16" else None

    def autocast(self):
        """Mixed precision around the forward passes only (backward runs outside it, as PyTorch advises)."""
        return autocast(self.train_precision, self.device)

    def step(self, batch: dict, step: int) -> torch.Tensor:
        """Train on one collated batch (on the device, or moved there here); returns its loss, detached, on the
        device."""
        batch = _to_device(batch, self.device)
        opt, scaler = self.optimizer, self.scaler
        opt.zero_grad(set_to_none=True)  # before the replay: last step's gradients may live in the graphs' memory
        if self.cuda_graphs:
            # a new iteration of the CUDA graph trees: the outputs of the last step's replays may be overwritten.
            # torch starts one itself at a compiled call with no backward pending; this says so where a method calls
            # the encoder more than once a step (torch.compiler.cudagraph_mark_step_begin)
            torch.compiler.cudagraph_mark_step_begin()
        loss = forward_backward(self.model, self.method, batch, scaler, self.grad_cache, step,
                                self.scheduler.get_last_lr()[0], autocast=self.autocast)
        if self.grad_cache:
            self.hooks.sync_gradients(self.method)
        if scaler is not None:
            scaler.unscale_(opt)
        if self.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(self.method.trainable_parameters(), self.grad_clip)
        if scaler is not None:
            scaler.step(opt)  # fp16 only: the scaler reads whether the gradients overflowed (a host sync)
            scaler.update()
        else:
            opt.step()
        self.scheduler.step()
        return loss.detach()


def forward_backward(model: torch.nn.Module, method: Method, batch: dict, scaler=None, grad_cache: int | None = None,
                     step: int = 0, lr: float = 0.0, autocast=contextlib.nullcontext) -> torch.Tensor:
    """One batch's loss and its gradients (accumulated into ``.grad``); through a gradient cache of
    ``grad_cache`` rows per chunk when given (raysent.models.chunked.GradCache). ``autocast()`` wraps
    every forward pass. A NaN or infinite loss is not checked here (that would wait on the device at every
    step): the loop catches it at its next log or eval interval (:class:`LossMeter`)."""
    def backward(loss: torch.Tensor) -> None:
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


# batch fields that stay on the host: the examples' positions in the data, which a per-sentence cache kept in host
# memory is indexed by (sg's views: reading them back from the device would wait on it)
HOST_FIELDS = frozenset({"index"})


def _to_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on ``device`` (non-blocking: from pinned memory the copy overlaps the computation),
    except :data:`HOST_FIELDS`."""
    out: dict[str, Any] = {}
    for k, v in batch.items():
        if isinstance(v, dict):
            out[k] = {kk: vv.to(device, non_blocking=True) for kk, vv in v.items()}
        elif isinstance(v, torch.Tensor) and k not in HOST_FIELDS:
            out[k] = v.to(device, non_blocking=True)
        else:
            out[k] = v
    return out

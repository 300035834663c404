"""The experiment schema: one YAML file describes one experiment, validated before anything runs.

Parts (docs/reference.md): ``name``, ``method``, ``model``, ``data``, ``train``, ``params``,
``search``, ``seeds``, ``resources``, ``tracking``, ``eval``. Only ``name``, ``method`` and
``model.name`` are required: everything else has the method's paper default (the paper is named
in each method's file) or a global default below.

Every error names the file, the line, the field path, the bad value and what is allowed; unknown
keys are errors (with a "did you mean"), so a typo is never silently ignored.

One name per hyperparameter everywhere (YAML, search space, MLflow params, table columns): the
fields of ``train``, of ``params`` (the method's own, e.g. ``temperature``, ``reg_lambda``) and
``model.dropout`` form one flat namespace, see :func:`hyperparameters` and :func:`with_overrides`.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from raysent.data.datasets import validate_spec
from raysent.errors import ConfigError, RaysentError, did_you_mean
from raysent.eval.names import EVAL_TASKS
from raysent.io import not_a_folder
from raysent.methods.spec import SPECS, get_spec

# Lazy imports: raysent's heavier modules (heavy, and only the functions that need them import them).


class Strict(BaseModel):
    # allow_inf_nan=False: every float field refuses inf and NaN, which `Field(gt=0)` lets through and JSON cannot
    # hold (a run record would say null); the error names the field the file gave (issue 60)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- names that become paths
# The experiment's name, the MLflow experiment and the registered model each name a folder (results/<name>/, the
# store's and the registry's) and are parts of run and file names: one rule for all of them, checked when the file
# is read, before anything is written. No '/' and no leading '.', so none leaves the results folder; at most
# NAME_MAX characters, so that the longest file name built on one (a run record, a trial folder) stays below the
# 255 bytes a file name may have.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"
NAME_MAX = 100
NAME_RULE = (f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most {NAME_MAX} characters "
             "(it names a folder under the results folder)")


def check_name(v: str | None) -> str | None:
    """``v`` if it is a valid name (:data:`NAME_RULE`); else ValueError saying what is allowed."""
    if v is None:
        return v
    if not re.fullmatch(NAME_PATTERN, v):
        raise ValueError(f"allowed: {NAME_RULE}")
    if len(v) > NAME_MAX:
        raise ValueError(f"{len(v)} characters; allowed: {NAME_RULE}")
    return v


Name = Annotated[str, AfterValidator(check_name)]


# --------------------------------------------------------------------------- parts
class ModelConfig(Strict):
    name: str = Field(description="hub id, local folder, or a folder name under RAYSENT_MODEL_DIR")
    revision: str | None = Field(None, description="a hub model's commit (or branch, tag) to read; null: main. The "
                                 "commit read is recorded on every run (model_source)")
    dropout: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="override the encoder's hidden and attention dropout (null: the checkpoint's)")


class DataConfig(Strict):
    train: str | None = Field(None, description="training data spec (NAME[:SPLIT], path:FILE); "
                              "default: the method's paper data")
    dev: list[str] = Field(default_factory=lambda: ["stsb:dev"],
                           description="dev sets for model selection; the score is their mean Spearman")
    max_train_samples: int | None = Field(None, gt=0, description="use a random subset of N training examples "
                                                                  "(the same subset for every seed)")
    sup: str | None = Field(None, description="ConSERT two-stage modes: the supervised first stage's data")

    @field_validator("dev", mode="before")
    @classmethod
    def _one_or_many(cls, v):
        return [v] if isinstance(v, str) else v

    @field_validator("dev")
    @classmethod
    def _dev_scored(cls, v):
        if not v:
            raise ValueError("at least one dev set is needed for model selection")
        for spec in v:
            try:
                validate_spec(spec, "scored_pairs")
            except RaysentError as exc:
                raise ValueError(str(exc)) from None
        return v


class TrainConfig(Strict):
    batch_size: int = Field(64, gt=0, description="the GLOBAL batch (split evenly over workers)")
    lr: float = Field(3e-5, gt=0, description="peak learning rate (AdamW)")
    epochs: int = Field(1, gt=0)
    max_steps: int | None = Field(None, gt=0, description="stop after this many optimizer steps")
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="linear warmup over this share of steps")
    weight_decay: float = Field(0.0, ge=0.0)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = Field(1e-8, gt=0)
    grad_clip: float | None = Field(1.0, gt=0, description="max gradient norm (null: no clipping)")
    max_length: int = Field(32, gt=1, description="max tokens per training sentence")
    eval_every: int = Field(125, gt=0, description="evaluate the dev sets every N steps (and at the end)")
    eval_at_start: bool = Field(True, description="evaluate the untuned model at step 0")
    eval_at_start_cache: bool = Field(True, description="reuse the step-0 dev scores an earlier run computed for the "
                                      "same weights, pooling and dev sets (under RAYSENT_CACHE_DIR, default "
                                      "~/.cache/raysent; raysent.train.initial_dev)")
    patience: int | None = Field(None, gt=0, description="stop after N evaluations without a new best")
    seed: int = 42
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="autocast: auto (bf16 on a CUDA device that supports it, fp32 on a CPU), bf16 (CPU and "
        "GPU), fp16 (with a gradient scaler; GPU only), fp32")
    gather_negatives: bool = Field(True, description="all-gather embeddings so every worker's loss sees "
                                   "the global batch as negatives (false: local negatives only)")
    bucket_by_length: bool = Field(False, description="group sentences of similar length into the same batches "
                                   "(changes which sentences are each other's negatives, so off by default)")
    # speedups that keep the loss and gradients of a step (raysent.models.chunked, tests/train/test_speedups.py)
    # auto: resolved per device, once, logged and recorded in result.json (raysent.train.device, docs/performance.md)
    length_buckets: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto", description="run each batch through the encoder in up to N length buckets, each padded to its own "
        "longest row (same loss and gradients, less padding; 1: off). auto: 4 on a CPU, where padding costs "
        "compute, 1 on a GPU, where each extra forward costs kernel launches")
    concat_views: bool = Field(True, description="encode all views / fields of a batch in one concatenated "
                               "forward (false: one forward each)")
    cache_views: bool = Field(True, description="sg/sg-opt: compute BERT_F's layer views once per sentence "
                              "before training and look them up (BERT_F never changes)")
    fused_adamw: bool | Literal["auto"] = Field(
        "auto", description="AdamW's fused implementation (one kernel for all parameters; the same update up to "
        "float rounding). auto: on, on CPU and GPU")
    huge_pages: bool | Literal["auto"] = Field(
        "auto", description="on CPU (Linux): PyTorch puts tensors of 2 MB and more on transparent huge pages "
        "(THP_MEM_ALLOC_ENABLE), so the large tensors each step allocates afresh fault in 2 MB at a time instead "
        "of 4 KiB (same numbers). auto: on when training on a CPU, off on a GPU")
    compile: bool | Literal["auto"] = Field(
        "auto", description="torch.compile the encoder's training forward, every batch padded to one of a few fixed "
        "widths (powers of two up to max_length) so each width compiles once; the same loss and gradients "
        "(tests/train/test_compile.py), a compile cost in the first steps. auto: on a CUDA device, with CUDA graphs, "
        "for a run of at least the break-even steps (2,490: docs/performance.md, \"train.compile: auto\"); off on a "
        "CPU, for a shorter run, and with length_buckets > 1 or grad_cache_rows (each logged, and recorded in "
        "result.json)")
    compile_mode: Literal["auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = Field(
        "auto", description="torch.compile's mode when the encoder is compiled. auto: reduce-overhead (CUDA graphs: "
        "a step's kernels replayed without the host launching each) on a CUDA device, default on a CPU")
    grad_cache_rows: int | None = Field(None, gt=0, description="gradient caching (GradCache): encode the batch "
                                        "in chunks of N rows, so a contrastive batch larger than memory gives "
                                        "the loss and gradients of the whole batch (null: off)")
    log_every: int = Field(10, gt=0)
    output_dir: str | None = Field(None, description="default: results/<name>/train/<method>-seed<seed>")

    @field_validator("adam_betas", mode="before")
    @classmethod
    def _two_betas(cls, v):
        if not isinstance(v, (list, tuple)) or len(v) != 2:
            raise ValueError("two values are needed, [beta1, beta2] (AdamW's betas), e.g. [0.9, 0.999]")
        return v

    @field_validator("adam_betas")
    @classmethod
    def _betas(cls, v):
        if not all(0.0 <= b < 1.0 for b in v):
            raise ValueError(f"both betas must be in [0, 1), got {list(v)}")
        return v


def _eval_task(v: str) -> str:
    if v not in EVAL_TASKS:
        raise ValueError(f"unknown evaluation task {v!r}{did_you_mean(v, EVAL_TASKS)}; allowed: "
                         + ", ".join(repr(t) for t in EVAL_TASKS))
    return v


class EvalConfig(Strict):
    tasks: list[Annotated[str, AfterValidator(_eval_task)]] = Field(
        default_factory=lambda: ["sts"],
        description="final-phase evaluation tasks (raysent.eval.suite): sts, senteval, search, geometry, sts17; "
        "a list or one comma-separated string")
    aggregation: Literal["all", "mean", "wmean"] = Field(
        "all", description="STS12-16 aggregation reported as the headline (all three are recorded)")
    sts_sets: list[str] | None = Field(None, description="the STS sets of the sts task (default: all seven: sts12 "
                                       "sts13 sts14 sts15 sts16 stsb sickr); a subset for quick checks")
    max_length: int = Field(256, gt=1, description="max tokens per sentence")
    batch_size: int = Field(128, gt=0, description="sentences per embedding batch")
    pooling: str | None = Field(None, description="override the method's inference pooling")
    # the senteval task (raysent.eval.senteval)
    senteval_tasks: list[str] | None = Field(None, description="SentEval transfer tasks: a subset of MR CR SUBJ "
                                             "MPQA SST2 TREC MRPC (default: all seven)")
    probe: Literal["logreg", "mlp"] = Field("logreg", description="SentEval classifier: logreg (scikit-learn "
                                            "logistic regression, SentEval's usepytorch=False) or mlp (SentEval's "
                                            "PyTorch MLP)")
    nhid: int | None = Field(None, ge=0, description="hidden units of the mlp probe (null: 50; 0: PyTorch "
                             "logistic regression, SimCSE's setting)")
    kfold: int = Field(10, ge=2, description="folds of SentEval's (inner) cross-validation")
    mrpc_features: Literal["senteval", "full"] = Field("senteval", description="MRPC classifier input: senteval "
                                                       "= (|u-v|, u*v) as SentEval; full = (u, v, |u-v|, u*v)")
    # the search and geometry tasks (raysent.eval.retrieval, raysent.eval.geometry)
    search_data: str = Field("stsb:test", description="scored pairs whose high-score pairs are (query, relevant "
                             "doc): e.g. stsb:test, stsb:train+dev+test, sickr:test, quora-duplicates (hub), "
                             "path:FILE")
    search_min_score: float | None = Field(None, description="gold score a pair needs to count as relevant "
                                           "(null: 4.0; 1.0 for 0/1 labels)")
    geometry_data: str = Field("stsb:test", description="scored pairs for alignment (pairs >= geometry_min_score) "
                               "and uniformity/spectrum (all sentences)")
    geometry_min_score: float = Field(4.0, description="gold score of the positive pairs for alignment")
    # the sts17 task (raysent.eval.sts17)
    sts17_tracks: list[str] | None = Field(None, description="STS17 tracks: a subset of ar-ar ar-en es-es "
                                           "es-en.track4a es-en.track4b en-en (default: all)")

    def task_options(self, n_jobs: int = 1) -> dict[str, dict]:
        """The evaluators' keyword arguments for :func:`raysent.eval.suite.evaluate_tasks` (``n_jobs``: probe
        fits in parallel, a property of the machine, not of the experiment)."""
        return {
            "sts": {"aggregation": self.aggregation, **({"tasks": self.sts_sets} if self.sts_sets else {})},
            "senteval": {"classifier": self.probe, "kfold": self.kfold, "mrpc_features": self.mrpc_features,
                         "n_jobs": n_jobs, **({"nhid": self.nhid} if self.nhid is not None else {}),
                         **({"tasks": self.senteval_tasks} if self.senteval_tasks else {})},
            "search": {"data": self.search_data, "min_score": self.search_min_score},
            "geometry": {"data": self.geometry_data, "min_score": self.geometry_min_score},
            "sts17": {"tracks": self.sts17_tracks} if self.sts17_tracks else {},
        }

    @field_validator("sts_sets")
    @classmethod
    def _known_sts_sets(cls, v):
        from raysent.errors import did_you_mean
        from raysent.eval.results import STS_LABELS as TASK_LABELS  # not raysent.eval.sts: scipy, 1 s

        for t in v or []:
            if t not in TASK_LABELS:
                raise ValueError(f"unknown STS set {t!r}{did_you_mean(t, TASK_LABELS)}; "
                                 f"allowed: {', '.join(TASK_LABELS)}")
        return v

    @field_validator("tasks", mode="before")
    @classmethod
    def _tasks_list(cls, v):
        return [t.strip() for t in v.split(",") if t.strip()] if isinstance(v, str) else v

    @field_validator("tasks")
    @classmethod
    def _tasks_given(cls, v):
        from raysent.eval.suite import EVAL_TASKS

        if not v:
            raise ValueError(f"at least one evaluation task is needed; allowed: {', '.join(map(repr, EVAL_TASKS))}")
        return list(dict.fromkeys(v))

    @field_validator("pooling")
    @classmethod
    def _pooling(cls, v):
        from raysent.models.pooling import check_pooling

        return check_pooling(v, "pooling", also=("method",))


class SpaceEntry(Strict):
    """One searched hyperparameter."""

    type: Literal["uniform", "loguniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    step: float | None = Field(None, gt=0)
    values: list[Any] | None = None
    when: dict[str, Any] | None = Field(
        None, description="sample only when another choice parameter has this value (or contains it)")

    @model_validator(mode="after")
    def _shape(self):
        if self.type == "choice":
            if not self.values:
                raise ValueError("a 'choice' entry needs a non-empty 'values' list")
            if self.low is not None or self.high is not None:
                raise ValueError("a 'choice' entry takes 'values', not 'low'/'high'")
        else:
            if self.low is None or self.high is None:
                raise ValueError(f"a '{self.type}' entry needs 'low' and 'high'")
            if not self.low < self.high:
                raise ValueError(f"'low' ({self.low}) must be below 'high' ({self.high})")
            if self.type == "loguniform" and self.low <= 0:
                raise ValueError(f"a 'loguniform' entry needs low > 0, got {self.low}")
            if self.type == "int" and (self.low != int(self.low) or self.high != int(self.high)):
                raise ValueError(f"an 'int' entry needs whole numbers, got {self.low}..{self.high}")
            if self.values is not None:
                raise ValueError(f"a '{self.type}' entry takes 'low'/'high', not 'values'")
        return self


class SchedulerConfig(Strict):
    type: Literal["asha"] = Field("asha", description="asha: Tune's ASHAScheduler on the seed mean (docs/search.md)")
    grace_period: int = Field(1, gt=0, description="evaluations before a trial can be stopped")
    reduction_factor: float = Field(2.0, gt=1.0)
    max_t: int | None = Field(None, gt=0, description="max evaluations a trial gets (default: all)")


# search.algorithm: the name in the YAML is the name in MLflow and the tables; ``optuna`` (the name before 2026-11)
# is read as ``optuna-tpe``, the sampler it always was (Optuna 5's TPESampler, multivariate by default)
ALGORITHMS = ("optuna-tpe", "optuna-gp", "random", "grid")
ALGORITHM_ALIASES = {"optuna": "optuna-tpe"}


class PrunerConfig(Strict):
    """Optuna's WilcoxonPruner over the per-seed dev scores a trial reports (raysent/tune/wilcoxon.py)."""

    type: Literal["wilcoxon"] = Field("wilcoxon", description="wilcoxon: stop a configuration once a one-sided "
                                      "Wilcoxon signed-rank test over its per-seed dev scores, paired with the best "
                                      "finished configuration's at the same seed and step, says it is worse "
                                      "(optuna.pruners.WilcoxonPruner's decision)")
    p_threshold: float = Field(0.1, gt=0.0, lt=1.0, description="stop when the test's p is below this (Optuna's "
                               "default 0.1; the test is repeated at every evaluation, so this is not a false-stop "
                               "rate)")
    n_startup_steps: int = Field(2, ge=0, description="paired scores needed before a configuration can be stopped "
                                 "(Optuna's default 2; the test needs at least 2 anyway)")


class SearchConfig(Strict):
    space: dict[str, SpaceEntry]
    metric: str = Field("dev_spearman", description="the value the search optimises (mean dev Spearman)")
    mode: Literal["max", "min"] = "max"
    num_samples: int = Field(8, gt=0, description="configurations to try")
    algorithm: Literal["optuna-tpe", "optuna-gp", "random", "grid"] = Field(
        "optuna-tpe", description="optuna-tpe: Optuna's TPESampler, multivariate (`optuna`, the earlier name, is "
        "read as optuna-tpe); optuna-gp: Optuna's GPSampler (Gaussian process, for small budgets); random: Optuna's "
        "RandomSampler; grid: every combination of the 'choice' entries (Tune's grid_search)")
    seed: int = Field(0, description="seed of the search algorithm (Optuna's sampler)")
    n_startup_trials: int | None = Field(None, ge=0, description="optuna-tpe, optuna-gp: configurations drawn at "
                                         "random before the model is used (null: Optuna's default, 10; with "
                                         "num_samples at or below it, TPE and GP are random search)")
    seeds: int = Field(1, gt=0, description="runs per configuration (different seeds); the search "
                       "sees their mean. With a scheduler, one trial trains all of a configuration's seeds in "
                       "turns and reports their mean dev curve, so the scheduler stops configurations on the "
                       "seed mean (docs/search.md)")
    scheduler: SchedulerConfig | None = None
    pruner: PrunerConfig | None = Field(None, description="wilcoxon (or {type: wilcoxon, p_threshold, "
                                        "n_startup_steps}): stop configurations by Optuna's WilcoxonPruner over their "
                                        "per-seed dev scores; needs search.seeds >= 2, not with search.scheduler")
    max_concurrent_trials: int | Literal["auto"] = Field(
        "auto", description="trials at once; auto (the default): as many as the cluster's GPUs (CPUs, for CPU trials) "
        "hold, counting the nodes its autoscaler can start (raysent.train.resources); a number caps it")

    @field_validator("max_concurrent_trials")
    @classmethod
    def _positive_concurrency(cls, v):
        if v != "auto" and v < 1:
            raise ValueError(f"got {v}: at least 1 trial, or auto")
        return v
    warm_start: Literal["paper", "none"] = Field(
        "paper", description="paper: the experiment's own values of the searched entries (its paper defaults) are "
        "the first configuration tried (Optuna's enqueue_trial; a grid gets them as its first point), and the "
        "final phase also runs them on every seed, so the summary compares the searched best with the paper's "
        "setting, paired over seeds")
    fail_fast: int = Field(3, ge=0, description="stop the search when its first N trials to end all failed "
                           "with the same error type, and report that error once (0: never)")
    keep_checkpoints: bool = Field(False, description="keep each finished trial's training checkpoints (model "
                                   "and optimizer state, read only to resume that trial); by default they are "
                                   "deleted once its run record and best model are saved")

    @field_validator("algorithm", mode="before")
    @classmethod
    def _alias(cls, v):
        return ALGORITHM_ALIASES.get(v, v) if isinstance(v, str) else v

    @field_validator("pruner", mode="before")
    @classmethod
    def _pruner_name(cls, v):
        return {"type": v} if isinstance(v, str) else v

    @property
    def early_stopping(self) -> SchedulerConfig | PrunerConfig | None:
        """What stops configurations early: the scheduler (ASHA) or the pruner (Wilcoxon), at most one."""
        return self.scheduler or self.pruner

    def check_with(self, cfg: ExperimentConfig) -> list[tuple[tuple, str]]:
        """The combinations with the rest of the experiment that cannot work: (field path, message) each."""
        out: list[tuple[tuple, str]] = []
        if self.algorithm == "grid" and any(e.type != "choice" for e in self.space.values()):
            bad = [n for n, e in self.space.items() if e.type != "choice"]
            out.append((("search", "algorithm"), f"grid needs 'choice' entries only; not: {', '.join(bad)} (their "
                        f"type: {', '.join(self.space[b].type for b in bad)}); allowed: make them 'choice' entries "
                        "with values, or algorithm optuna-tpe, optuna-gp or random"))
        if self.algorithm == "grid" and self.n_startup_trials is not None:
            out.append((("search", "n_startup_trials"), f"got {self.n_startup_trials}: it is for optuna-tpe and "
                        "optuna-gp (the random draws before their model is used); algorithm grid tries every point; "
                        "allowed: null"))
        p = self.pruner
        if p is None:
            return out
        if self.scheduler is not None:
            return [(("search", "pruner"), f"{p.type} and search.scheduler ({self.scheduler.type}) both stop "
                     "configurations early; allowed: one of them (remove search.scheduler or search.pruner)")]
        if self.seeds < 2:
            return [(("search", "pruner"), f"{p.type} tests a configuration's per-seed dev scores against the best "
                     f"one's, so it needs search.seeds >= 2, got search.seeds {self.seeds}; allowed: search.seeds >= 2 "
                     "(3 or more gives the test power), or no pruner (search.scheduler: {type: asha} stops on one "
                     "seed)")]
        # WilcoxonPruner's smallest one-sided p over k pairs is 1/2^k: the pairs a configuration has before its
        # last evaluation (each seed's evaluations after step 0, which is the untouched encoder) must reach it
        t = cfg.train
        if t.max_steps:
            before_end = max(0, math.ceil(t.max_steps / t.eval_every) - 1)
            pairs = before_end * self.seeds
            needed = max(2, p.n_startup_steps, math.floor(math.log2(1 / p.p_threshold)) + 1)
            if pairs < needed:
                out.append((("search", "pruner"), f"wilcoxon can never stop a configuration: before its last "
                            f"evaluation it has {pairs} paired per-seed scores ({self.seeds} seed(s) x {before_end} "
                            f"evaluation(s) after step 0: train.max_steps {t.max_steps}, train.eval_every "
                            f"{t.eval_every}), and the test needs {needed} (the exact one-sided Wilcoxon's smallest "
                            f"p over k pairs is 1/2^k, below p_threshold {p.p_threshold} from k = {needed}; "
                            f"n_startup_steps {p.n_startup_steps}); allowed: more search.seeds, a smaller "
                            "train.eval_every, a larger search.pruner.p_threshold, or no pruner"))
        return out

    @model_validator(mode="after")
    def _conditions(self):
        for name, entry in self.space.items():
            for ref in (entry.when or {}):
                if ref not in self.space:
                    raise ValueError(f"space.{name}.when refers to {ref!r}, which is not searched")
                if self.space[ref].type != "choice":
                    raise ValueError(f"space.{name}.when refers to {ref!r}, which is not a 'choice' entry")
                if ref == name:
                    raise ValueError(f"space.{name}.when refers to itself")
        return self


GPUS_ALLOWED = ('"auto" (1 when the Ray cluster has GPUs, else 0), or a number >= 0: a fraction up to 1 (0.25: four '
                "trials share a GPU) or a whole number")


class ResourcesConfig(Strict):
    workers: int | None = Field(None, gt=0, description="Ray Train workers (null: train in this process)")
    gpus_per_worker: float | Literal["auto"] = Field(
        "auto", description="GPUs of each Ray Train worker, or of each trial that trains in its own process. auto: 1 "
        "when the Ray cluster has GPUs (resolved once, when the run starts, logged and recorded), else 0; for trials "
        "in their own process, 1/k when a probe of the trial's step on a GPU measures k trials at once training at "
        "least 5 % faster together and leaving 10 % of its memory free (raysent.train.packing); a fraction (0.25) "
        "shares a GPU between trials, each capped at its share of the memory; 0 trains on the CPU, the trial then sees "
        "no GPU (raysent.train.resources)")
    cpus_per_worker: float = Field(1.0, gt=0.0)
    trial_cpus: float = Field(0.1, gt=0.0, description="CPUs of each Tune trial's own driver")
    max_failures: int = Field(0, ge=0, description="worker failures Ray Train recovers from")
    storage_path: str | None = Field(None, description="Ray checkpoints: a folder or a URI (s3://, gs://); "
                                     "default results/<name>/ray")
    address: str | None = Field(None, description="Ray cluster address (auto, ray://host:10001); "
                                "default local (or RAY_ADDRESS)")

    @field_validator("gpus_per_worker", mode="before")
    @classmethod
    def _gpus(cls, v, info):
        if v == "auto":
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"allowed: {GPUS_ALLOWED}")
        if v < 0:
            raise ValueError(f"a negative number; allowed: {GPUS_ALLOWED}")
        if v > 1 and v != int(v):
            raise ValueError("a share of a GPU is at most 1, and more than one GPU is a whole number; "
                             f"allowed: {GPUS_ALLOWED}")
        workers = info.data.get("workers")
        if workers and workers > 1 and 0 < v < 1:
            raise ValueError(f"a share of a GPU with resources.workers={workers}: the workers of one run form one NCCL "
                             "group, which cannot hold two workers on one GPU; allowed: 1 or more whole GPUs per "
                             "worker, or resources.workers: 1 (or null) for a share of a GPU")
        return float(v)


class TrackingConfig(Strict):
    mlflow_uri: str | None = Field(None, description="default MLFLOW_TRACKING_URI, else "
                                   "sqlite:///<results_dir>/mlflow.db")
    experiment: Name | None = Field(None, description="MLflow experiment and the results folder's name (default: "
                                    "the config's name); the same rule as name")
    results_dir: str = "results"
    enabled: bool = True
    log_model: Literal["best", "all", "none"] = Field(
        "best", description="models logged with MLflow's sentence_transformers flavour after the final phase: the "
        "winner's final run with the best dev score (best), every final seed of the winner (all), or none; the "
        "best one is registered in the model registry")
    registered_model: Name | None = Field(None, description="the model registry's name for the best model "
                                          "(default: the MLflow experiment's name); each search adds a version; the "
                                          "same rule as name")
    registry_uri: str | None = Field(None, description="MLflow model registry (default MLFLOW_REGISTRY_URI, else the "
                                     "tracking store)")
    server: Literal["auto", "always", "never"] = Field(
        "auto", description="serve a local store to the trials with `mlflow server` on the driver for the time of a "
        "search: auto (when the Ray cluster has more than one node), always (e.g. an autoscaling cluster that "
        "starts with its head alone), never")
    server_port: int | None = Field(None, gt=0, lt=65536, description="that server's port (default: a free one)")

    @field_validator("results_dir")
    @classmethod
    def _a_folder(cls, v):
        why = not_a_folder(v)
        if why:
            raise ValueError(f"{why}; give a folder (created if missing), e.g. results")
        return v


class ExperimentConfig(Strict):
    name: Name = Field(description=f"{NAME_RULE}: names results/<name>/")
    method: str
    model: ModelConfig
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    params: dict[str, Any] = Field(default_factory=dict, description="the method's hyperparameters")
    search: SearchConfig | None = None
    seeds: list[int] = Field(default_factory=lambda: [42], description="final-phase seeds")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)

    # where it came from (not part of the schema)
    _source: str = "<config>"

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, v):
        twice = sorted({s for s in v if v.count(s) > 1})
        if twice:
            distinct: list[int] = []
            for s in v:
                while s in distinct:
                    s += 1
                distinct.append(s)
            raise ValueError(f"seed{'s' if len(twice) > 1 else ''} {', '.join(map(str, twice))} given more than once, "
                             "and each (configuration, seed) runs once: remove the repeat or give distinct seeds, "
                             f"e.g. {distinct}")
        return v

    # ------------------------------------------------------------------ helpers
    @property
    def method_params(self):
        """The method's validated parameter object (typed, defaults filled)."""
        return get_spec(self.method).Params(**self.params)

    @property
    def results_dir(self) -> Path:
        return Path(self.tracking.results_dir) / self.name

    def output_dir(self) -> Path:
        if self.train.output_dir:
            return Path(self.train.output_dir)
        return self.results_dir / "train" / f"{self.method}-seed{self.train.seed}"

    def to_dict(self) -> dict:
        d = self.model_dump(mode="json")
        if d.get("search"):  # space entries: only the fields that were given
            d["search"]["space"] = {k: {f: v for f, v in e.items() if v is not None}
                                    for k, e in d["search"]["space"].items()}
        return d

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)


# --------------------------------------------------------------------------- loading
# The registered methods' names in `raysent methods`' order (their descriptions import no torch: a file is checked
# before torch loads; tests/methods/test_method_names.py checks each registered method is its spec's subclass)
METHOD_NAMES: tuple[str, ...] = tuple(SPECS)
GLOBAL_DEFAULTS_NOTE = "raysent default"


def _node_line(root: yaml.Node | None, path: tuple) -> int | None:
    """Line (1-based) of the YAML node at ``path`` (or of its closest existing parent)."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for key in path:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(key):
                    node, line = v, k.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            return line
    return line


def _fmt_value(v: Any) -> str:
    """The value as the error shows it: a long list or mapping is cut at 80 characters, a string (a path, a
    name) only past 400, so that the path a user must fix is shown whole."""
    text = repr(v)
    limit = 400 if isinstance(v, str) else 80
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _explain(err: Mapping[str, Any], allowed_keys: dict[tuple, list[str]]) -> str:
    loc, kind, msg = tuple(err["loc"]), err["type"], err["msg"]
    field = ".".join(str(p) for p in loc)
    if kind == "extra_forbidden":
        parent, key = loc[:-1], loc[-1]
        allowed = allowed_keys.get(parent, [])
        where = ".".join(str(p) for p in parent) or "the top level"
        return (f"unknown key {key!r} in {where}{did_you_mean(key, allowed)}; allowed keys: "
                f"{', '.join(allowed) or '(none)'}")
    if kind == "missing":
        return f"{field}: required field is missing"
    msg = msg.removeprefix("Value error, ")
    if kind == "finite_number":
        msg = "allowed: a finite number (not inf or NaN)"
    return f"{field}: got {_fmt_value(err.get('input'))}: {msg}"


def _allowed_keys(method_cls) -> dict[tuple, list[str]]:
    keys = {
        (): list(ExperimentConfig.model_fields),
        ("model",): list(ModelConfig.model_fields),
        ("data",): list(DataConfig.model_fields),
        ("train",): list(TrainConfig.model_fields),
        ("search",): list(SearchConfig.model_fields),
        ("resources",): list(ResourcesConfig.model_fields),
        ("tracking",): list(TrackingConfig.model_fields),
        ("eval",): list(EvalConfig.model_fields),
        ("search", "scheduler"): list(SchedulerConfig.model_fields),
        ("search", "pruner"): list(PrunerConfig.model_fields),
    }
    if method_cls is not None:
        keys[("params",)] = list(method_cls.Params.model_fields)
    return keys


def _raise_validation(exc: ValidationError, source: str, root, method_cls, prefix: tuple = ()) -> None:
    allowed = _allowed_keys(method_cls)
    # search.space.<name>.<field>: entries share one allowed-key list
    lines = []
    for err in exc.errors():
        loc = prefix + tuple(err["loc"])
        if len(loc) >= 3 and loc[:2] == ("search", "space"):
            allowed[loc[:3]] = list(SpaceEntry.model_fields)
        line = _node_line(root, loc)
        lines.append(f"{source}{f':{line}' if line else ''}: {_explain({**err, 'loc': loc}, allowed)}")
    raise ConfigError("invalid experiment config\n  " + "\n  ".join(lines))


def parse_config(raw: dict, source: str = "<config>", root: yaml.Node | None = None,
                 check_search: bool = True) -> ExperimentConfig:
    """Validate a config mapping: method defaults first, then the user's values on top.

    ``check_search=False`` skips validating each search-space value (done once when loading).
    """
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of the parts "
                          f"{', '.join(ExperimentConfig.model_fields)}, got {type(raw).__name__}")
    raw = copy.deepcopy(raw)
    method_name = raw.get("method")
    method_cls = None
    if method_name is None:  # said before the methods (and torch) are imported
        line = _node_line(root, ())
        raise ConfigError(f"{source}{f':{line}' if line else ''}: 'method' is missing; allowed: "
                          f"{', '.join(METHOD_NAMES)}")
    if not isinstance(method_name, str) or method_name not in METHOD_NAMES:
        line = _node_line(root, ("method",))
        raise ConfigError(f"{source}{f':{line}' if line else ''}: method: got {_fmt_value(method_name)}: unknown "
                          f"method{did_you_mean(str(method_name), METHOD_NAMES)}; allowed: {', '.join(METHOD_NAMES)}")
    method_cls = get_spec(method_name)

    # The method's paper defaults under the user's values.
    for part in ("model", "data", "train", "eval"):
        if part in raw and raw[part] is not None and not isinstance(raw[part], dict):
            line = _node_line(root, (part,))
            raise ConfigError(f"{source}{f':{line}' if line else ''}: {part}: got {_fmt_value(raw[part])}: "
                              f"expected a mapping of fields")
    params_raw = raw.get("params") or {}
    if not isinstance(params_raw, dict):
        line = _node_line(root, ("params",))
        raise ConfigError(f"{source}{f':{line}' if line else ''}: params: expected a mapping of the method's "
                          f"hyperparameters ({', '.join(method_cls.Params.model_fields)})")
    try:
        params = method_cls.Params(**params_raw)
    except ValidationError as exc:
        _raise_validation(exc, source, root, method_cls, prefix=("params",))
    defaults = method_cls.defaults(params)
    for part in ("model", "data", "train", "eval"):
        merged = dict(defaults.get(part, {}))
        merged.update(raw.get(part) or {})
        raw[part] = merged
    if "seeds" not in raw and method_cls.seeds:
        raw["seeds"] = list(method_cls.seeds)
    raw["params"] = params.model_dump(mode="json")
    try:
        cfg = ExperimentConfig(**raw)
    except ValidationError as exc:
        _raise_validation(exc, source, root, method_cls)
    cfg._source = source
    _cross_checks(cfg, method_cls, source, root, check_search)
    return cfg


def _cross_checks(cfg: ExperimentConfig, method_cls, source: str, root, check_search: bool = True) -> None:
    def fail(path: tuple, msg: str) -> NoReturn:
        line = _node_line(root, path)
        raise ConfigError(f"invalid experiment config\n  {source}{f':{line}' if line else ''}: "
                          f"{'.'.join(map(str, path))}: {msg}")

    if cfg.data.train is None:
        fail(("data", "train"), f"no training data: method {cfg.method} has no default; give a data spec")
    try:
        validate_spec(cfg.data.train, method_cls.data_kind(cfg.method_params))
    except RaysentError as exc:
        fail(("data", "train"), str(exc))
    if cfg.data.sup is not None:
        try:
            validate_spec(cfg.data.sup)
        except RaysentError as exc:
            fail(("data", "sup"), str(exc))
    if cfg.train.grad_cache_rows and not method_cls.supports_grad_cache:
        fail(("train", "grad_cache_rows"), f"got {cfg.train.grad_cache_rows}: method {cfg.method} does not support "
             "gradient caching (its augmentations act inside the encoder, row by row); allowed: null")
    # only an explicit compile: true refuses these; compile: auto gives way to them (it resolves off, and says so:
    # raysent.train.device.resolve_compile), so they stay allowed on every device
    if cfg.train.compile is True and cfg.train.length_buckets not in ("auto", 1):
        fail(("train", "length_buckets"), f"got {cfg.train.length_buckets}: train.compile: true pads every batch to a "
             "few fixed widths for the compiled graphs; length buckets would give each piece its own width; allowed "
             "with compile: true: auto or 1 (or train.compile: auto, which then leaves compiling off, or false)")
    if cfg.train.compile is True and cfg.train.grad_cache_rows:
        fail(("train", "grad_cache_rows"), f"got {cfg.train.grad_cache_rows}: gradient caching trims each chunk to "
             "its own widest row, a new shape for the compiled graph at every chunk; allowed with train.compile: "
             "true: null (or train.compile: auto, which then leaves compiling off, or false)")
    if cfg.resources.workers and cfg.train.batch_size % cfg.resources.workers:
        fail(("train", "batch_size"), f"got {cfg.train.batch_size}: the global batch must split evenly over "
             f"resources.workers={cfg.resources.workers}")
    if not cfg.seeds:
        fail(("seeds",), "at least one seed is needed")
    if (cfg.search is not None and cfg.search.early_stopping is not None and cfg.search.seeds > 1
            and cfg.resources.workers):
        what = "search.scheduler" if cfg.search.scheduler is not None else "search.pruner"
        fail(("resources", "workers"), f"got {cfg.resources.workers}: with {what} and search.seeds > 1 a "
             "trial trains its configuration's seeds in turns in its own process; allowed: null (each trial "
             f"still gets resources.gpus_per_worker), or search.seeds: 1, or no {what.split('.')[1]}")
    for path, msg in (cfg.search.check_with(cfg) if cfg.search is not None else []):
        fail(path, msg)
    if cfg.search is not None and check_search:
        names = hyperparameter_names(cfg)
        for key, entry in cfg.search.space.items():
            if key not in names:
                fail(("search", "space", key), f"{key!r} is not a hyperparameter of {cfg.method}"
                     f"{did_you_mean(key, names)}; searchable: {', '.join(sorted(names))}")
            # each sampled value must itself validate: a choice's values, a range's low and high
            samples: list[Any] = entry.values if entry.values is not None else [entry.low, entry.high]
            for value in samples:
                if entry.type == "int":
                    value = int(value)
                try:
                    with_overrides(cfg, {key: value})
                except ConfigError as exc:
                    fail(("search", "space", key), f"the value {_fmt_value(value)} is not valid: "
                         + str(exc).split(": ", 2)[-1])
        if cfg.search.metric != "dev_spearman" and not cfg.search.metric.startswith("dev/"):
            fail(("search", "metric"), f"got {cfg.search.metric!r}: allowed: dev_spearman (the mean over "
                 f"data.dev) or dev/<set>, e.g. dev/stsb:dev")


def no_search_part(source: str) -> RaysentError:
    """`raysent tune` (and ``raysent.search``) on an experiment without a ``search`` part: the one wording, said by
    the command before the search's modules load and by the driver for a Python caller."""
    return RaysentError(f"{source}: `raysent tune` needs a 'search' part (space, metric, num_samples, ...); use "
                        "`raysent train` for one configuration, or --final-only to run the seeds only")


def _duplicate_keys(root: yaml.Node | None, source: str) -> list[str]:
    """One line per key given twice in the same mapping, at any depth (PyYAML keeps the last value silently)."""
    keys = yaml.SafeLoader("")  # builds key values only: 1 and 0x1 are the same key, "lr" and lr too
    found: list[str] = []
    seen_nodes: set[int] = set()

    def walk(node, path: tuple) -> None:
        if id(node) in seen_nodes:  # an alias: checked where its anchor is
            return
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for k, v in node.value:
                try:
                    key = keys.construct_object(k, deep=True)
                    hash(key)
                except Exception:  # a key that is itself a list or mapping: compared by its text
                    key = (k.tag, repr(k.value))
                line = k.start_mark.line + 1
                if key in first:
                    field = ".".join(map(str, (*path, key)))
                    found.append(f"{source}:{line}: {field}: the key {key!r} is given twice (first on line "
                                 f"{first[key]}); YAML would keep only the last value: remove one of them")
                else:
                    first[key] = line
                walk(v, (*path, key))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, i))

    if root is not None:
        walk(root, ())
    return found


def read_yaml(path: str | os.PathLike, what: str) -> tuple[Any, yaml.Node | None]:
    """The data of a YAML file and its node tree (for line numbers); ``what`` names the kind of file in errors
    ("an experiment YAML file"). Unreadable text, invalid YAML and a key given twice in one mapping are
    :class:`ConfigError`s naming the file and the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected {what}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason})") from None
    try:
        root = yaml.compose(text)
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{path}{where}: not valid YAML: {problem}") from None
    duplicates = _duplicate_keys(root, str(path))
    if len(duplicates) == 1:
        raise ConfigError(duplicates[0])
    if duplicates:
        raise ConfigError(f"{len(duplicates)} keys given twice\n  " + "\n  ".join(duplicates))
    return raw, root


def load_config(path: str | os.PathLike, overrides: dict | None = None) -> ExperimentConfig:
    """Read and validate an experiment YAML (``overrides``: flat hyperparameter names, see below)."""
    path = Path(path)
    raw, root = read_yaml(path, "an experiment YAML file")
    if raw is None:
        raise ConfigError(f"{path}: the file is empty; an experiment needs at least name, method and model.name")
    cfg = parse_config(raw, source=str(path), root=root)
    return user_overrides(cfg, overrides) if overrides else cfg


# --------------------------------------------------------------------------- hyperparameters
_HP_SECTIONS = ("train", "params", "model")
_NOT_HYPERPARAMETERS = {"name", "output_dir", "log_every", "eval_at_start", "eval_at_start_cache"}


def hyperparameter_names(cfg: ExperimentConfig) -> set[str]:
    names = set(TrainConfig.model_fields) | set(cfg.params) | {"dropout"}
    return names - _NOT_HYPERPARAMETERS


def hyperparameters(cfg: ExperimentConfig) -> dict[str, Any]:
    """The flat ``{name: value}`` of every hyperparameter (MLflow params, table columns)."""
    out: dict[str, Any] = {"method": cfg.method, "model": cfg.model.name, "train_data": cfg.data.train}
    out.update({k: v for k, v in cfg.train.model_dump(mode="json").items() if k not in _NOT_HYPERPARAMETERS})
    out.update(cfg.params)
    out["dropout"] = cfg.model.dropout
    return out


def with_overrides(cfg: ExperimentConfig, overrides: dict[str, Any]) -> ExperimentConfig:
    """A re-validated copy with flat hyperparameters replaced (``{'temperature': 0.1, 'lr': 1e-4}``).

    Dotted paths (``train.seed``, ``data.train``) are accepted too.
    """
    raw = cfg.to_dict()
    names = hyperparameter_names(cfg)
    for key, value in overrides.items():
        if key in ("method", "params", "seeds", "name"):  # whole top-level parts
            raw[key] = value
        elif "." in key:
            section, _, field = key.partition(".")
            if section not in raw or not isinstance(raw[section], dict):
                raise ConfigError(f"override {key!r}: no config part {section!r}")
            raw[section][field] = value
        elif key == "dropout":
            raw["model"]["dropout"] = value
        elif key in TrainConfig.model_fields:
            raw["train"][key] = value
        elif key in raw["params"]:
            raw["params"][key] = value
        else:
            raise ConfigError(f"override {key!r}: not a hyperparameter of {cfg.method}"
                              f"{did_you_mean(key, names)}; allowed: {', '.join(sorted(names))}")
    if isinstance(raw.get("train", {}).get("adam_betas"), list):
        raw["train"]["adam_betas"] = tuple(raw["train"]["adam_betas"])
    return parse_config(raw, source=cfg._source, check_search=False)


def user_overrides(cfg: ExperimentConfig, overrides: Mapping[str, Any]) -> ExperimentConfig:
    """:func:`with_overrides` of the values a user gave (``--set``, ``overrides=``): an error names the field and
    the override that set it (``--set lr=.inf``: "train.lr: got inf ... (with the override lr=inf)")."""
    try:
        return with_overrides(cfg, dict(overrides))
    except ConfigError as exc:
        given = ", ".join(f"{k}={_fmt_value(v)}" for k, v in overrides.items())
        raise ConfigError(f"{exc}\n  (with the override{'s' if len(overrides) > 1 else ''} {given}: --set or "
                          "overrides=)") from None


def finite(x: float) -> bool:
    return x is not None and not (isinstance(x, float) and (math.isnan(x) or math.isinf(x)))

"""The record of one ``raysent bench`` run, typed: :class:`BenchResult` is what :func:`raysent.bench.run_bench`
returns, what ``results/bench/<date>-<time>.json`` holds (its JSON keys are these fields' names) and what
:func:`raysent.bench.format_markdown` reads.

One section per part, None where the part did not run. A case that fails loses only itself: its error goes into
``failed_cases`` and the part's other cases stay in its section. A part that fails as a whole after measuring
some of its cases keeps those (``failed`` names it; the overhead part keeps its ways measured before the one that
failed), so the fields a part fills late are optional. :func:`raysent.bench.run_bench` hands the record to be
written after every case, so a run that is killed keeps what it measured. On disk a section holds what was
measured and nothing more: a field never set is left out, not written as null (:meth:`BenchResult.to_json`).
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from raysent.bench.options import BenchOptions, Part


class _Model(BaseModel):
    # NaN (a loss that diverged) is written as NaN, as json.dump writes it, not as null
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="constants")


class CaseResult(_Model):
    """One training case as :mod:`raysent.bench.cases` measured it in its own process (a raysent method's or
    sentence-transformers' MNRL), and on a GPU its model FLOPs."""

    # the case's process reports more than the summary reads (device, precision, threads, loss, data, optimizer,
    # and each kind of case its own): kept as it came, so that the file holds every number that was measured
    model_config = ConfigDict(extra="allow")

    steps: int = Field(description="timed steps")
    seconds: float
    steps_per_second: float
    sentences_per_second: float
    peak_rss_mib: float
    cuda_peak_mib: float | None = Field(description="None without a GPU")
    prepare: dict[str, Any] | None = Field(default=None, description="what a method computed before training "
                                                                     "(sg-opt's view cache); absent for st-mnrl")
    real_tokens_per_step: float | None = Field(default=None, description="non-padding tokens of a step's batch, "
                                               "each text field once (st-mnrl: counted from its sentences)")
    encoder_params_non_embedding: int | None = Field(
        default=None, description="N of the MFU: the encoder's parameters outside its embeddings and pooler")
    # the gpu part's model FLOPs (PaLM, Chowdhery et al. 2022, App. B; raysent.bench.runner.model_flops_per_step),
    # from what the case measured: its encoder's shape and the real tokens it encodes per step
    encoder_layers: int | None = None
    attention_heads: int | None = None
    head_dim: int | None = None
    encoder_passes: float | None = Field(
        default=None, description="rows through the encoder with gradients ÷ rows of the batch (simcse-unsup: 2 "
        "dropout views; st-mnrl: anchor and positive)")
    encoder_tokens_per_step: float | None = Field(default=None, description="ΣT over the encoded rows of a step")
    encoder_tokens_sq_per_step: float | None = Field(default=None, description="ΣT² over the same rows")
    model_flops_per_step: float | None = Field(default=None, description="6N·ΣT + 12·L·H·Q·ΣT²")
    model_tflops: float | None = Field(default=None, description="the gpu part: model FLOPs per second ÷ 1e12")
    peak_tflops: float | None = Field(default=None, description="the device peak the MFU is taken against")
    peak_kind: str | None = Field(default=None, description="which peak: bf16 dense, tf32 dense or fp32")
    mfu: float | None = Field(default=None, description="the gpu part: model_tflops ÷ peak_tflops (before "
                              "peak_tflops was recorded: ÷ the device's bf16 peak)")
    warmup_seconds: float | None = Field(default=None, description="raysent's cases: the untimed warm-up steps, "
                                         "a compile included")
    attention: str | None = Field(default=None, description="the attention implementation the encoder ran "
                                  "(transformers' _attn_implementation: sdpa, eager, …); absent before 2026-12-03")
    compile_seconds: float | None = Field(
        default=None, description="raysent's compiled cases: the warm-up's seconds beyond what its steps take at the "
        "timed rate, an estimate of the compile (None: not compiled)")


class TrainingResult(_Model):
    """The training part: each method's case, sentence-transformers' MNRL, and each method's steps/s ÷ MNRL's."""

    methods: dict[str, CaseResult]
    st_mnrl: CaseResult | None = Field(default=None, description="None: its case failed (BenchResult.failed_cases)")
    steps_per_second_vs_st_mnrl: dict[str, float]


class SpeedupResult(_Model):
    """One speedup on (raysent's default) and off, everything else equal."""

    method: str
    on: CaseResult
    off: CaseResult
    on_settings: dict[str, Any] | Literal["defaults"] = Field(description="the train settings of 'on'")
    off_settings: dict[str, Any]
    speedup: float = Field(description="steps/s on ÷ off")
    peak_rss_ratio: float = Field(description="peak RSS on ÷ off")


class ScoreComparison(_Model):
    """One STS test set's Spearman ×100 on both sides."""

    raysent: float
    sentence_transformers: float
    difference: float


class EvaluationSeconds(_Model):
    raysent: list[float]
    sentence_transformers: list[float]


class SentencesEmbedded(_Model):
    raysent: int  # each distinct sentence once
    sentence_transformers: int


class EvaluationResult(_Model):
    """The evaluation part: raysent's STS evaluation against sentence-transformers' EmbeddingSimilarityEvaluator
    (:mod:`raysent.bench.evaluation`)."""

    model: str
    max_length: int
    repeats: int
    raysent_seconds: float = Field(description="the fastest of the repeats")
    sentence_transformers_seconds: float
    all_seconds: EvaluationSeconds
    speedup: float
    scores: dict[str, ScoreComparison]
    max_abs_difference: float
    equal_scores: bool = Field(description="every set's scores within the tolerance")
    tolerance: float
    sentences_embedded: SentencesEmbedded


class CpuShare(_Model):
    """CPU of Ray's processes while a way ran, % of one core (:meth:`raysent.bench.overhead.RayCpu.summary`)."""

    trainer: str
    trainer_percent: float
    others_percent: float
    processes: int
    others: dict[str, float]


class TorchThreads(_Model):
    bare: int
    ray_train: int


class OverheadResult(_Model):
    """The overhead part: the same run bare, on Ray Train and in Tune trials (:mod:`raysent.bench.overhead`), in
    the order it measures them; ``<way>_ratio`` is the way's seconds ÷ the bare loop's and ``<way>_overhead`` that
    minus one. Only the run's settings are always there: a way that failed, and those after it, are left out."""

    steps: int
    batch_size: int
    eval_every: int
    trials: int = Field(default=1, description="Tune trials per Tune way (records before it ran one)")
    bare_seconds: float | None = None
    bare_train_seconds: float | None = None
    bare_phases: dict[str, float] = Field(default_factory=dict)
    ray_init_seconds: float | None = Field(default=None, description="None: Ray was already started")
    ray_train_seconds: float | None = None
    ray_train_cpu: CpuShare | None = Field(default=None, description="None where /proc cannot be read")
    ray_train_train_seconds: float | None = None
    ray_train_phases: dict[str, float] = Field(default_factory=dict)
    torch_threads: TorchThreads | None = None
    tune_trial_each: list[float] = Field(default_factory=list, description="each trial's seconds, in turn")
    tune_in_trial_each: list[float] = Field(default_factory=list)
    tune_in_trial_cpu: CpuShare | None = None
    tune_trial_seconds: float | None = Field(default=None, description="the first trial")
    tune_trial_next_seconds: float | None = Field(default=None, description="the mean of the later trials")
    tune_in_trial_seconds: float | None = None
    tune_in_trial_next_seconds: float | None = None
    ray_train_ratio: float | None = None
    ray_train_overhead: float | None = None
    tune_trial_ratio: float | None = None
    tune_trial_overhead: float | None = None
    tune_trial_next_ratio: float | None = None
    tune_trial_next_overhead: float | None = None
    tune_in_trial_ratio: float | None = None
    tune_in_trial_overhead: float | None = None
    tune_in_trial_next_ratio: float | None = None
    tune_in_trial_next_overhead: float | None = None


class GpuResult(_Model):
    """The gpu part: simcse-unsup on its defaults, in fp32 and with each speedup flipped, and sentence-transformers'
    MNRL, on the device (:data:`raysent.bench.options.GPU_CASES`, in the order run), or why it did not run (then
    nothing else is set). A case that failed is absent here and named in ``BenchResult.failed_cases``."""

    skipped: str | None = None
    device: str | None = None
    peak_bf16_tflops: float | None = Field(default=None, description="None: a device not in PEAK_BF16_TFLOPS")
    peak_tf32_tflops: float | None = Field(default=None, description="dense TF32 (fp32 cases whose matrix "
                                           "products torch runs in TF32)")
    peak_fp32_tflops: float | None = Field(default=None, description="fp32 without tensor cores (torch's default "
                                           "float32_matmul_precision 'highest')")
    mfu_formula: str | None = None
    cases: dict[str, CaseResult] = Field(default_factory=dict)
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict, description="each raysent case's train "
                                                 "settings against the defaults ({} for the defaults)")
    steps_per_second_vs_st_mnrl_bf16: dict[str, float] = Field(
        default_factory=dict, description="each case's steps/s ÷ sentence-transformers MNRL bf16's, same run")
    compile_cache: str | None = Field(default=None, description="the compiler's cache folder the part's cases "
                                      "share, empty at its start (so the first compile of a graph is cold)")
    compile_first: str | None = Field(default=None, description="the first compiled case with the settings of a "
                                      "later one (a search's first trial)")
    compile_again: str | None = Field(default=None, description="that later case (a search's later trial: its "
                                      "graphs in the cache)")
    compile_again_vs_first: float | None = Field(default=None, description="compile_seconds of compile_again ÷ "
                                                 "compile_first's")


class ProfileCase(_Model):
    """One side of the profile part: ``steps`` training steps under torch.profiler (raysent.bench.profile)."""

    model_config = ConfigDict(extra="allow")  # settings, threads and what else the case reports

    steps: int = Field(description="profiled steps")
    device: str
    precision: str
    ops_per_step: float = Field(description="aten operators the host dispatched per step, nested ones included")
    top_level_ops_per_step: float = Field(description="aten operators called from outside another aten operator")
    host_ms_per_step: float = Field(description="host wall time per step (the profiler's step spans)")
    sync_ops_per_step: dict[str, float] = Field(
        description="aten operators that make the host wait for a CUDA device (.item(), nonzero, ...): counted on "
        "any device")
    sync_op_sources: dict[str, float] = Field(
        default_factory=dict, description="the same per step by where they were called from (operator < its "
        "callers, up to the first that is not an aten operator: the optimizer, autograd, or the step's own code)")
    kernels_per_step: float | None = Field(default=None, description="CUDA: kernels launched per step")
    device_ms_per_step: float | None = Field(default=None, description="CUDA: kernel time per step")
    sync_calls_per_step: dict[str, float] | None = Field(
        default=None, description="CUDA: runtime calls that make the host wait (cudaStreamSynchronize, ...), and "
        "device-to-host copies")
    top_ops: dict[str, float] = Field(default_factory=dict, description="the most frequent aten operators per step")


class ProfileResult(_Model):
    """The profile part: raysent's simcse-unsup step (its Stepper) and sentence-transformers' MNRL step (its
    Trainer) under torch.profiler, same model, data, batch and precision. A side that failed is None (and named
    in ``BenchResult.failed_cases``)."""

    method: str
    warmup: int
    raysent: ProfileCase | None = None
    st_mnrl: ProfileCase | None = None


class SearchWayResult(_Model):
    """One way of the search part (:mod:`raysent.bench.search`): the search phase as its process reported it."""

    model_config = ConfigDict(extra="allow")

    same_as: str | None = Field(default=None, description="not run: it would have run with this way's settings")
    note: str | None = None
    wall_seconds: float | None = Field(default=None, description="the search itself, from its start (Ray's start "
                                       "included) to its last trial's end")
    process_seconds: float | None = Field(default=None, description="the way's process, its imports included")
    trials_finished: int | None = None
    configurations_per_hour: float | None = Field(default=None, description="trials_finished × 3600 ÷ wall_seconds")
    best_lr: float | None = None
    best_dev_spearman: float | None = Field(default=None, description="its best trial's STS-B dev Spearman × 100")
    device: str | None = None
    precision: str | None = None
    attention: str | None = Field(default=None, description="the encoder's attention implementation")
    compile: bool | None = None
    cuda_graphs: bool | None = None
    trials_per_gpu: int | None = None
    trials_at_once: int | None = None
    gpu_util_mean_percent: float | None = Field(default=None, description="nvidia-smi's utilization.gpu, the mean of "
                                                "its half-second samples over the way's process (None: no NVIDIA GPU)")
    gpu_util_samples: int | None = None
    gpu_memory_peak_mib: float | None = None


class SearchPartResult(_Model):
    """The search part: the same short search three ways (:mod:`raysent.bench.search`); ``ratios``:
    ``defaults_vs_one_per_gpu`` (configurations per hour) and ``st_vs_raysent_wall`` (sentence-transformers' wall ÷
    raysent's on its defaults)."""

    trials: int
    steps: int
    lrs: list[float]
    batch_size: int
    max_length: int
    model: str
    ways: dict[str, SearchWayResult]
    ratios: dict[str, float] = Field(default_factory=dict)


class Target(_Model):
    value: float | None = Field(description="None: not measured")
    target: float
    met: bool | None


class Targets(_Model):
    """What the project promises (issue "Performance"), checked against what was measured
    (:func:`raysent.bench.runner.check_targets`)."""

    simcse_unsup_vs_st_mnrl: Target
    evaluation_speedup: Target
    tune_train_overhead: Target  # lower is better
    sg_opt_cached_views: Target
    # the gpu part's (absent where it measured none): simcse-unsup on its defaults ÷ MNRL bf16, and its MFU at a
    # batch of 512 or more
    gpu_simcse_unsup_vs_st_mnrl: Target | None = None
    gpu_mfu: Target | None = None
    # issue 61: a search's later trial compiles from the shared caches, at most a tenth of the first's compile (lower
    # is better; absent where no two compiled cases with the same settings ran)
    gpu_compile_again_vs_first: Target | None = None
    # issue 61: the search part on CUDA: configurations per hour, the defaults ÷ one trial per GPU without graphs, and
    # sentence-transformers' hyperparameter_search wall ÷ raysent's (absent where it did not run on a GPU)
    gpu_search_defaults_vs_one_per_gpu: Target | None = None
    gpu_search_st_vs_raysent_wall: Target | None = None


class Machine(_Model):
    platform: str
    python: str
    cpus: int | None
    torch: str
    transformers: str
    torch_threads: int
    cuda: str | None = Field(description="the GPU's name; None without one")
    ray: str | None = Field(description="None: not installed")
    sentence_transformers: str | None


class BenchResult(_Model):
    """One ``raysent bench`` run."""

    # a part's section, or what a failed part measured, is checked against its type as the run records it
    model_config = ConfigDict(validate_assignment=True)

    options: BenchOptions
    started: _dt.datetime = Field(description="local time, to the second")
    machine: Machine
    training: TrainingResult | None = None
    speedups: dict[str, SpeedupResult] | None = None
    evaluation: EvaluationResult | None = None
    overhead: OverheadResult | None = None
    gpu: GpuResult | None = None
    profile: ProfileResult | None = None
    search: SearchPartResult | None = None
    failed: dict[Part, str] = Field(default_factory=dict, description="each failed part's error")
    failed_cases: dict[Part, dict[str, str]] = Field(
        default_factory=dict, description="per part, each case that failed and its error (the part's other cases "
        "are in its section)")
    interrupted: Part | None = Field(default=None, description="the part Ctrl-C (or SIGTERM) stopped; none ran "
                                     "after it")
    interrupted_by: Literal["SIGINT", "SIGTERM"] | None = Field(default=None, description="None: SIGINT (records "
                                                                "from before the field)")
    interrupted_case: str | None = Field(default=None, description="the case running when it was interrupted")
    targets: Targets | None = None
    seconds: float | None = Field(default=None, description="the whole run's wall time")

    def measured(self, part: Part) -> bool:
        """Whether ``part`` left a section: all of it, or what it measured before it failed."""
        return getattr(self, part) is not None

    def to_json(self) -> dict[str, Any]:
        """The record as plain data for ``json.dump``: only what was set, so a part or a way that did not run is
        absent, not null."""
        return self.model_dump(mode="json", exclude_unset=True)

"""What one ``raysent bench`` run measures (:class:`BenchOptions`, the command's flags) and the names its
options may take."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from raysent.errors import RaysentError

# Lazy imports: raysent's heavier modules (heavy, and only the functions that need them import them).

Part = Literal["training", "speedups", "evaluation", "overhead", "gpu", "profile", "search"]
PARTS: tuple[Part, ...] = ("training", "speedups", "evaluation", "overhead", "gpu", "profile", "search")
SPEEDUPS = ("length_buckets", "concat_views", "cache_views", "huge_pages", "all_speedups", "grad_cache")
STS_SETS = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
METHODS = ("simcse-unsup", "simcse-sup", "sg", "sg-opt", "consert", "layeratt", "supcon", "sbert-nli")
# the gpu part's cases, most important first (a run cut short by a timeout keeps the cases measured before it):
# simcse-unsup on its defaults, sentence-transformers' MNRL in bf16 (what the ratios are taken against), fp32, each
# speedup flipped against the device's default, the defaults once more (the first case of a run read 13 % low on an
# H200: results/bench/20261127-141237.md; the repeat shows such an order effect, and on CUDA, where the defaults
# compile, it is the later trial of a search that finds the graphs in the compile cache), MNRL in fp32, then
# torch.compile explicitly (on CUDA: as the defaults) and in its default mode (no CUDA graphs). `eager` is the
# defaults without compiling (train.compile false), as the defaults were before issue 61.
GPU_CASES = ("defaults", "st-mnrl-bf16", "eager", "fp32", "length-buckets-4", "fused-adamw-off", "huge-pages-on",
             "defaults-again", "st-mnrl-fp32", "compile", "compile-default")


@dataclass
class BenchOptions:
    model: str = "paraphrase-MiniLM-L3-v2"
    batch_size: int = 64
    max_length: int = 32
    warmup: int = 3
    steps: int = 20
    parts: list[str] = field(default_factory=lambda: list(PARTS))
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    overhead_steps: int = 200
    overhead_trials: int = 2  # Tune trials per Tune way, one after another, as a search runs them
    eval_repeats: int = 2
    eval_max_length: int = 256
    eval_sets: list[str] = field(default_factory=lambda: list(STS_SETS))
    speedups: list[str] = field(default_factory=lambda: list(SPEEDUPS))
    cpus: float = 2.0
    threads: int | None = None
    output_dir: str = "results/bench"
    peak_tflops: float | None = None
    grad_cache_batch: int = 512  # the gradient-caching case: a batch large enough for activations to matter
    grad_cache_rows: int | None = None  # default: an eighth of that batch
    gpu_cases: list[str] = field(default_factory=lambda: list(GPU_CASES))  # run in the order given
    profile_steps: int = 5  # profiled steps of each side of the profile part (after --warmup steps)
    search_trials: int = 4  # the search part's trials (learning rates of raysent.bench.search.SEARCH_LRS)
    search_steps: int = 50  # steps of each of its trials

    def check(self) -> None:
        bad = [p for p in self.parts if p not in PARTS]
        if bad:
            raise RaysentError(f"--parts: unknown part(s) {', '.join(bad)}; allowed: {', '.join(PARTS)}")
        from raysent.methods import METHODS as REGISTERED

        bad = [m for m in self.methods if m not in REGISTERED or not REGISTERED[m].trains]
        if bad:
            raise RaysentError(f"--methods: unknown or non-training method(s) {', '.join(bad)}; allowed: "
                               f"{', '.join(m for m, c in REGISTERED.items() if c.trains)}")
        if self.batch_size < 2 or self.grad_cache_batch < 2:
            raise RaysentError("--batch-size and --grad-cache-batch must be at least 2")
        bad = [t for t in self.speedups if t not in SPEEDUPS]
        if bad:
            raise RaysentError(f"--speedups: unknown speedup(s) {', '.join(bad)}; allowed: {', '.join(SPEEDUPS)}")
        bad = [t for t in self.eval_sets if t not in STS_SETS]
        if bad or not self.eval_sets:
            raise RaysentError(f"--eval-sets: unknown set(s) {', '.join(bad) or '(none given)'}; allowed: "
                               f"{', '.join(STS_SETS)}")
        if self.overhead_trials < 1:
            raise RaysentError("--overhead-trials must be >= 1")
        if self.steps < 2 or self.warmup < 1:
            raise RaysentError("--steps must be >= 2 and --warmup >= 1")
        bad = [c for c in self.gpu_cases if c not in GPU_CASES]
        repeated = sorted({c for c in self.gpu_cases if self.gpu_cases.count(c) > 1})
        if bad or repeated or not self.gpu_cases:
            what = (f"unknown case(s) {', '.join(bad)}" if bad else f"case(s) given twice: {', '.join(repeated)}"
                    if repeated else "no case given")
            raise RaysentError(f"--gpu-cases: {what}; allowed, each at most once, in the order to run them: "
                               f"{', '.join(GPU_CASES)}")
        if self.profile_steps < 1:
            raise RaysentError("--profile-steps must be >= 1")
        if not 1 <= self.search_trials <= 8 or self.search_steps < 1:
            raise RaysentError(f"--search-trials must be 1 to 8 (got {self.search_trials}) and --search-steps >= 1 "
                               f"(got {self.search_steps})")

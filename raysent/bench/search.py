"""``raysent bench`` part 7, ``search``: the same short search three ways, in one run (issue 61, "The bench measures
a search, not only a step").

The search: unsupervised SimCSE (Gao et al. 2021) on the bench's model, batch and length, mean pooling, a grid of
``--search-trials`` learning rates (:data:`SEARCH_LRS`, the first ones), one seed, ``--search-steps`` steps each, the
STS-B dev Spearman at the end as the objective. The ways:

* ``one-per-gpu``: ``raysent tune`` as it ran before issue 61: ``train.compile: false`` and
  ``resources.gpus_per_worker: 1`` (0 on a machine without a GPU), so one trial per GPU, one after another on one GPU;
* ``defaults``: ``raysent tune`` on its defaults: ``train.compile: auto`` (CUDA graphs on CUDA past the break-even)
  and ``gpus_per_worker: auto`` (trials packed onto the GPU where the probe measures that it pays). Without CUDA
  both settings resolve as ``one-per-gpu``'s, so it is not run again: its record says so (``same_as``);
* ``st-hpsearch``: sentence-transformers' ``SentenceTransformerTrainer.hyperparameter_search`` with the Optuna
  backend (its documented route, sbert.net "Hyperparameter Optimization": ``model_init``, a loss built per model,
  ``hp_space``, ``compute_objective``), on the same learning rates (Optuna's ``GridSampler``: each tried once), steps,
  model, batch, length and sentences, scored by its ``EmbeddingSimilarityEvaluator`` on STS-B dev.

Each way runs in a fresh process (:mod:`raysent.bench.cases`); the raysent ways run the search phase alone
(``tune_experiment(search_only=True)``: no final phase, as ``hyperparameter_search`` has none), Ray's start
included. Reported per way: wall seconds, configurations per hour, the best learning rate and its dev score, what the
trials were given (trials per GPU, at once) and trained with (compile, CUDA graphs, attention implementation), and,
where ``nvidia-smi`` answers, the GPU's utilisation sampled every half second (:class:`GpuSampler`). A way that fails
loses only itself.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from raysent.bench.result import SearchPartResult, SearchWayResult

# Lazy imports: torch, datasets, optuna, sentence_transformers, transformers, raysent's search driver (heavy, and only
# the case functions, in their own processes, need them).

SEARCH_LRS = (1e-5, 2e-5, 3e-5, 5e-5, 1e-4, 2e-4, 3e-4, 5e-4)  # the grid's first --search-trials values
WAYS = ("one-per-gpu", "defaults", "st-hpsearch")
SAMPLE_S = 0.5  # nvidia-smi's sampling period


class GpuSampler:
    """GPU 0's utilisation (percent of the time a kernel ran) and memory in use, from ``nvidia-smi -lms``, while a
    way runs; ``summary()`` is None where there is no ``nvidia-smi`` (no NVIDIA GPU)."""

    def __init__(self, period_s: float = SAMPLE_S):
        self.period_ms = int(period_s * 1000)
        self.util: list[float] = []
        self.memory: list[float] = []
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        exe = shutil.which("nvidia-smi")
        if exe is not None:
            self.proc = subprocess.Popen([exe, "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,"
                                          "nounits", "-i", "0", f"-lms={self.period_ms}"], stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                util, mem = (float(x) for x in line.split(","))
            except ValueError:  # "[N/A]", a header
                continue
            self.util.append(util)
            self.memory.append(mem)

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        if self.thread is not None:
            self.thread.join(timeout=10)

    def summary(self) -> dict | None:
        if not self.util:
            return None
        return {"gpu_util_mean_percent": sum(self.util) / len(self.util), "gpu_util_samples": len(self.util),
                "gpu_memory_peak_mib": max(self.memory)}


def search_lrs(trials: int) -> list[float]:
    return list(SEARCH_LRS[:trials])


def search_config(model: str, batch_size: int, max_length: int, steps: int, lrs: list[float], results: str,
                  cpus: float) -> dict:
    """The raysent side's experiment: simcse-unsup, mean pooling, a grid over ``lrs``, one seed, the dev score at
    the end (no step-0 evaluation: sentence-transformers' search has none), nothing tracked or published."""
    return {
        "name": "bench-search", "method": "simcse-unsup", "model": {"name": model},
        "data": {"train": "wiki1m", "dev": "stsb:dev", "max_train_samples": batch_size * (steps + 1)},
        "train": {"batch_size": batch_size, "max_length": max_length, "max_steps": steps, "eval_every": steps,
                  "eval_at_start": False},
        "params": {"pooling": "mean"},
        "search": {"metric": "dev_spearman", "mode": "max", "algorithm": "grid", "seeds": 1, "warm_start": "none",
                   "space": {"lr": {"type": "choice", "values": lrs}}},
        "seeds": [1], "resources": {"workers": None, "cpus_per_worker": cpus},
        "tracking": {"enabled": False, "results_dir": results, "log_model": "none"},
    }


def _spec(opts, way: str, cuda: bool) -> dict:
    lrs = search_lrs(opts.search_trials)
    base = {"label": way, "model": opts.model, "batch_size": opts.batch_size, "max_length": opts.max_length,
            "steps": opts.search_steps, "lrs": lrs, "threads": opts.threads}
    if way == "st-hpsearch":
        return {**base, "kind": "st-hpsearch"}
    overrides = {"train.compile": False, "resources.gpus_per_worker": 1 if cuda else 0} if way == "one-per-gpu" else {}
    return {**base, "kind": "raysent-search", "overrides": overrides, "cpus": 1.0}


def bench_search(opts, rec, cuda: bool) -> SearchPartResult:
    """The three ways in turn (:data:`WAYS`), each in its own process under a :class:`GpuSampler`; the record is
    updated after each."""
    from raysent.bench.runner import run_case

    out = SearchPartResult(trials=opts.search_trials, steps=opts.search_steps, lrs=search_lrs(opts.search_trials),
                           batch_size=opts.batch_size, max_length=opts.max_length, model=opts.model, ways={})
    rec.update("search", out)
    for way in WAYS:
        if way == "defaults" and not cuda:
            out.ways = {**out.ways, way: SearchWayResult(same_as="one-per-gpu", note=(
                "not run: without CUDA train.compile auto stays off and gpus_per_worker auto gives 0 GPUs, "
                "one-per-gpu's settings"))}
            rec.update("search", out)
            continue
        rec.say(f"search: {way}, {opts.search_trials} trial(s) of {opts.search_steps} steps")
        rec.current = way
        try:
            with GpuSampler() as gpu:
                t0 = time.perf_counter()
                case = run_case(_spec(opts, way, cuda), rec.say, SearchWayResult)
                wall = time.perf_counter() - t0
        except Exception as exc:
            rec.fail("search", way, exc)
            continue
        finally:
            rec.current = None
        case.process_seconds = wall
        case.configurations_per_hour = (case.trials_finished or 0) * 3600.0 / case.wall_seconds \
            if case.wall_seconds else None
        gpu_summary = gpu.summary()
        if gpu_summary:
            case = case.model_copy(update=gpu_summary)
        out.ways = {**out.ways, way: case}
        out.ratios = ratios(out.ways)
        rec.update("search", out)
    return out


def ratios(ways: dict[str, SearchWayResult]) -> dict[str, float]:
    """``defaults_vs_one_per_gpu``: configurations per hour, the defaults ÷ one trial per GPU without graphs (1.0
    where the defaults are the same settings); ``st_vs_raysent_wall``: sentence-transformers' wall ÷ raysent's on
    its defaults."""
    out: dict[str, float] = {}
    one, st = ways.get("one-per-gpu"), ways.get("st-hpsearch")
    d = ways.get("defaults")
    if d is not None and d.same_as == "one-per-gpu":
        d = one
    if d is not None and one is not None and d.configurations_per_hour and one.configurations_per_hour:
        out["defaults_vs_one_per_gpu"] = d.configurations_per_hour / one.configurations_per_hour
    if d is not None and st is not None and d.wall_seconds and st.wall_seconds:
        out["st_vs_raysent_wall"] = st.wall_seconds / d.wall_seconds
    return out


# ----------------------------------------------------------------------------------------------- the cases
def raysent_search_case(spec: dict) -> dict:
    """raysent's search phase of :func:`search_config` with the way's ``overrides``, in this (fresh) process."""
    from raysent.config import parse_config, with_overrides
    from raysent.train.records import RunRecord
    from raysent.tune.driver import tune_experiment

    with tempfile.TemporaryDirectory(prefix="raysent-bench-search-") as scratch:
        raw = search_config(spec["model"], int(spec["batch_size"]), int(spec["max_length"]), int(spec["steps"]),
                            list(spec["lrs"]), scratch, float(spec["cpus"]))
        cfg = with_overrides(parse_config(raw, source="<raysent bench search>"), spec["overrides"])
        t0 = time.perf_counter()
        summary = tune_experiment(cfg, quiet=True, search_only=True)
        wall = time.perf_counter() - t0
        runs = [RunRecord.model_validate(json.loads(p.read_text()))
                for p in sorted((Path(scratch) / "bench-search" / "runs").glob("search-*.json"))]
        best = max(runs, key=lambda r: r.best_dev_spearman) if runs else None
        res = summary.resources or {}
        first = runs[0] if runs else None
        settings = (first.settings or {}) if first else {}
        return {"wall_seconds": wall, "trials_finished": len(runs),
                "best_lr": best.hp.get("lr") if best else None,  # the space's key (search_config)
                "best_dev_spearman": best.best_dev_spearman if best else None,
                "device": first.device if first else None, "precision": first.precision if first else None,
                "attention": first.attention if first else None,
                "compile": settings.get("compile"), "cuda_graphs": settings.get("cuda_graphs"),
                "compile_note": settings.get("compile_note"),
                "trials_per_gpu": res.get("trials_per_gpu"), "trials_at_once": res.get("at_once"),
                "gpus_per_trial": res.get("gpus_per_worker"),
                "packing": (res.get("packing") or {}).get("reason")}


def st_search_case(spec: dict) -> dict:
    """sentence-transformers' ``hyperparameter_search`` (Optuna) over ``lrs``, in this (fresh) process."""
    with tempfile.TemporaryDirectory(prefix="raysent-bench-st-search-") as scratch:
        return _st_search(spec, scratch)


def _st_search(spec: dict, scratch: str) -> dict:
    import optuna
    import torch
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers import SentenceTransformerTrainingArguments as Arguments
    from sentence_transformers.evaluation import EmbeddingSimilarityEvaluator
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import PreTrainedModel

    from raysent.data import load
    from raysent.methods.simcse_unsup import SimCSEUnsupParams
    from raysent.models.encoder import attention_implementation
    from raysent.models.locate import resolve_model
    from raysent.train.device import auto_precision

    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    b, steps, lrs = int(spec["batch_size"]), int(spec["steps"]), [float(x) for x in spec["lrs"]]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = auto_precision(device)
    path, _ = resolve_model(spec["model"])
    t0 = time.perf_counter()
    sentences = list(load("wiki1m", "sentences").sentences())[: b * steps]
    train = Dataset.from_dict({"anchor": sentences, "positive": sentences})
    dev = load("stsb:dev", "scored_pairs")
    evaluator = EmbeddingSimilarityEvaluator(list(dev.sentence1), list(dev.sentence2), [float(s) for s in dev.scores],
                                             main_similarity="cosine", similarity_fn_names=["cosine"], name="stsb-dev",
                                             write_csv=False)
    seen: dict[str, str | None] = {}

    def model_init(trial=None):
        model = SentenceTransformer(path, device=device)
        model.max_seq_length = int(spec["max_length"])
        seen["attention"] = attention_implementation(next(m for m in model.modules()
                                                          if isinstance(m, PreTrainedModel)))
        return model

    def loss_init(model):
        return MultipleNegativesRankingLoss(model, scale=1.0 / SimCSEUnsupParams().temperature)

    args = Arguments(output_dir=scratch, per_device_train_batch_size=b, max_steps=steps, warmup_ratio=0.0,
                     lr_scheduler_type="linear", logging_strategy="no", save_strategy="no", eval_strategy="no",
                     report_to="none", dataloader_drop_last=True, seed=1, disable_tqdm=True, use_cpu=device == "cpu",
                     bf16=precision == "bf16")
    trainer = SentenceTransformerTrainer(model_init=model_init, args=args, train_dataset=train, loss=loss_init,
                                         evaluator=evaluator)
    def objective(metrics: dict) -> float:
        return float(metrics["eval_stsb-dev_spearman_cosine"])

    def hp_space(trial):
        return {"learning_rate": trial.suggest_categorical("learning_rate", lrs)}

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    best = trainer.hyperparameter_search(hp_space=hp_space, compute_objective=objective, n_trials=len(lrs),
                                         direction="maximize", backend="optuna",
                                         sampler=optuna.samplers.GridSampler({"learning_rate": lrs}, seed=0))
    wall = time.perf_counter() - t0
    return {"wall_seconds": wall, "trials_finished": len(lrs), "best_lr": float(best.hyperparameters["learning_rate"]),
            "best_dev_spearman": float(best.objective) * 100.0, "device": device, "precision": precision,
            "attention": seen.get("attention"), "compile": False, "cuda_graphs": False, "trials_at_once": 1,
            "trials_per_gpu": 1 if device == "cuda" else 0}

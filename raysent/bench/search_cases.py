"""The search part's ways (:mod:`raysent.bench.search`), each run by ``python -m raysent.bench.search_cases SPEC``
in a process of its own, which prints one line ``RESULT {json}`` as :mod:`raysent.bench.cases` does: raysent's
search phase (``raysent-search``) and sentence-transformers' ``hyperparameter_search`` (``st-hpsearch``).

A module apart from :mod:`raysent.bench.cases` because it runs raysent's search driver, which itself reaches the
bench's cases (the GPU probe measures with :class:`~raysent.bench.cases.MethodRun`).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from raysent.bench.cases import main

# Lazy imports: torch, datasets, optuna, sentence_transformers, transformers, raysent's search driver (heavy, and only
# the case functions, in their own processes, need them).


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


CASES = {"raysent-search": raysent_search_case, "st-hpsearch": st_search_case}

if __name__ == "__main__":
    sys.exit(main(cases=CASES))

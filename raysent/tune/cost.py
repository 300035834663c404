"""The cost model behind every time estimate (`raysent train --dry-run`, `raysent tune --dry-run`, a suite's
plan): seconds per optimizer step of each method at a reference batch and length, per dev and test evaluation,
per run and per phase, scaled by a run's batch × length and multiplied out by its steps, runs and how many run at
once. A suite file's ``estimate`` calibrates it (benchmarks/mini.yaml holds the costs measured on 2 CPU cores);
without one, :class:`Estimate`'s defaults give a rough figure.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from raysent.config import ExperimentConfig
from raysent.data.datasets import load
from raysent.errors import ConfigError, RaysentError
from raysent.methods.spec import get_spec
from raysent.tune.plan import SearchPlan


class Estimate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: str = Field("cpu", description="what the costs were measured on")
    step_seconds: dict[str, float] = Field(default_factory=lambda: {"default": 1.0},
                                           description="seconds per optimizer step, by method (and 'default')")
    dev_eval_seconds: float = 3.0
    test_eval_seconds: float = 20.0
    run_overhead_seconds: float = 5.0
    phase_overhead_seconds: float = Field(15.0,
                                          description="starting a search or a final phase (Tune, trial processes)")
    train_sizes: dict[str, int] = Field(default_factory=dict, description="training examples of data specs whose "
                                        "size is not known here (for runs given in epochs)")
    reference_batch: int = Field(64, description="the batch size step_seconds were measured at")
    reference_length: int = Field(32, description="the max length step_seconds were measured at (a step costs in "
                                  "proportion to batch x max length)")


def run_steps(cfg: ExperimentConfig, est: Estimate) -> int:
    """Optimizer steps of one run (every stage): max_steps, else epochs over the training data."""
    method = get_spec(cfg.method)
    if not getattr(method, "trains", True):
        return 0
    t = cfg.train
    params = cfg.params
    stages = 2 if params.get("supervision") in ("sup-unsup", "joint-unsup") else 1
    if t.max_steps:
        return t.max_steps * stages
    total = 0
    for stage in range(stages):
        spec = (cfg.data.sup if stage == 0 and stages == 2 else cfg.data.train) or next(
            iter(method.data_defaults.values()), None)
        n = cfg.data.max_train_samples or (est.train_sizes.get(spec) if spec else None) or _local_size(spec)
        epochs = params.get("sup_epochs", 1) if stage == 0 and stages == 2 else t.epochs
        total += epochs * math.ceil(n / t.batch_size)
    return total


def _local_size(spec: str | None) -> int:
    if spec is None:
        raise ConfigError("a run given in epochs needs its training data's size: add it to estimate.train_sizes")

    try:
        return len(load(spec))
    except RaysentError:
        raise ConfigError(f"training data {spec!r} is not available here, so its size is unknown: add it to the "
                          "suite's estimate.train_sizes") from None


def estimate_seconds(cfg: ExperimentConfig, arm: str, est: Estimate) -> dict:
    """Runs and seconds of one arm by the suite's cost model."""
    steps = run_steps(cfg, est)
    per_step = est.step_seconds.get(cfg.method, est.step_seconds.get("default", 1.0))
    per_step *= cfg.train.batch_size * cfg.train.max_length / (est.reference_batch * est.reference_length)
    evals = (steps // cfg.train.eval_every + 2) if steps else 1
    train = steps * per_step + evals * est.dev_eval_seconds + est.run_overhead_seconds
    final = len(cfg.seeds)
    search = trials = reused = 0
    if arm == "searched":
        plan = SearchPlan.of(cfg)
        search, trials = plan.runs, plan.trials
        # the winner's final runs on seeds the search trained it on evaluate those runs (raysent.tune.trial.
        # trained_in_search), unless a scheduler or pruner may have stopped them
        if cfg.search is not None and cfg.search.early_stopping is None:
            reused = len(set(cfg.seeds) & set(plan.seeds))
    trained = final - reused
    conc = planned_concurrency(cfg)
    run_seconds = (search * train + trained * train + final * est.test_eval_seconds
                   + reused * est.run_overhead_seconds)
    # trials run in rounds of `conc` (a last, partial round leaves workers idle); a trial that trains its
    # configuration's seeds in turns takes search / trials runs' time
    wall = (math.ceil(trials / conc) * train * (search // max(trials, 1))
            + math.ceil(trained / conc) * train
            + math.ceil(final / conc) * est.test_eval_seconds + math.ceil(reused / conc) * est.run_overhead_seconds
            + est.phase_overhead_seconds * (2 if search else 1))
    r = cfg.resources
    gpus = (r.workers or 1) * planned_gpus(cfg)
    return {"search_runs": search, "final_runs": final, "final_runs_reused": reused, "steps_per_run": steps,
            "seconds": wall,
            "gpu_seconds": run_seconds * gpus}


def planned_gpus(cfg: ExperimentConfig) -> float:
    """``resources.gpus_per_worker``, ``auto`` as it resolves on the Ray this process is connected to, else on this
    machine (raysent.train.resources)."""
    if cfg.resources.gpus_per_worker != "auto":
        return float(cfg.resources.gpus_per_worker)
    from raysent.preflight import available_resources
    from raysent.train.resources import auto_gpus

    return auto_gpus(available_resources()[0]["GPU"])


def planned_concurrency(cfg: ExperimentConfig) -> int:
    """``search.max_concurrent_trials``, ``auto`` as it resolves on the Ray this process is connected to (the nodes
    its autoscaler can start included), else on this machine (raysent.train.resources.concurrency)."""
    asked = cfg.search.max_concurrent_trials if cfg.search else 1
    if asked != "auto":
        return max(1, int(asked))
    from raysent.preflight import available_resources
    from raysent.train.resources import concurrency

    return concurrency(cfg, available_resources()[0], planned_gpus(cfg))[0]


def rough_estimate(cfg: ExperimentConfig, searched: bool) -> dict[str, Any]:
    """Wall time by the default cost model (:class:`Estimate`): a rough figure, and it says so."""
    try:
        e = estimate_seconds(cfg, "searched" if searched else "paper", Estimate())
    except RaysentError as exc:
        return {"unknown": str(exc)}
    return {"optimizer steps per run": e["steps_per_run"], "runs": e["search_runs"] + e["final_runs"],
            "final runs that evaluate a search run": e["final_runs_reused"],
            "wall minutes": round(e["seconds"] / 60, 1),
            "model": "1 s per step at batch 64 × length 32 (CPU), scaled by batch × length; a suite file's "
                     "`estimate` calibrates it"}

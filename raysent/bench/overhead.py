"""``raysent bench`` part 3: what Ray Train and Ray Tune cost around the same training run.

The same run (config, seed, steps, dev evaluations, checkpoints, result.json) three ways:

* ``bare``: :func:`raysent.train.run.train_in_process` in this (already warm) process;
* ``ray_train``: :func:`raysent.train.ray_train.train_with_ray` with one Ray Train worker (the
  controller and worker processes are started, import torch and load the model: all counted);
* ``tune_trial``: one Ray Tune trial whose function trainable launches that TorchTrainer, exactly
  as a `raysent tune` trial does (:func:`raysent.tune.search._train`).

Starting Ray itself (``ray.init``) happens once per search, not per trial, and is reported apart.
The overhead of a way is its wall time over the bare run's, minus one.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from pathlib import Path


def bench_overhead(raw_config: dict, steps: int, cpus: float, say=lambda m: None) -> dict:
    import ray
    from ray import tune

    from raysent.config import parse_config, with_overrides
    from raysent.train.ray_train import init_ray, train_with_ray
    from raysent.train.run import train_in_process
    from raysent.tune.search import _train

    root = Path(tempfile.mkdtemp(prefix="raysent-bench-overhead-"))
    base = parse_config(raw_config, source="<raysent bench>")
    base = with_overrides(base, {"train.max_steps": steps, "tracking.enabled": False})
    out: dict = {"steps": steps, "batch_size": base.train.batch_size, "eval_every": base.train.eval_every}
    try:
        say(f"  bare loop: {steps} steps in this process")
        cfg = with_overrides(base, {"train.output_dir": str(root / "bare")})
        t0 = time.perf_counter()
        bare = train_in_process(cfg, quiet=True)
        out["bare_seconds"] = time.perf_counter() - t0
        out["bare_train_seconds"] = bare["train_seconds"]

        t0 = time.perf_counter()
        started_here = not ray.is_initialized()
        if started_here and not (base.resources.address or os.environ.get("RAY_ADDRESS")):
            # the worker gets the CPUs the bare loop had (Ray gives an actor floor(CPUs) torch threads), and the
            # trial's own driver, idle while Train runs, 0.1 more: one logical CPU beyond the cores
            ray.init(num_cpus=math.ceil(cpus) + 1, dashboard_host="127.0.0.1", log_to_driver=False)
        else:
            init_ray(base)
        out["ray_init_seconds"] = time.perf_counter() - t0 if started_here else None

        ray_cfg = with_overrides(base, {"resources.workers": 1, "resources.cpus_per_worker": cpus,
                                        "resources.trial_cpus": 0.1})
        say(f"  Ray Train, 1 worker: {steps} steps")
        t0 = time.perf_counter()
        ray_run = train_with_ray(with_overrides(ray_cfg, {"train.output_dir": str(root / "train")}), quiet=True)
        out["ray_train_seconds"] = time.perf_counter() - t0
        out["ray_train_train_seconds"] = ray_run["train_seconds"]
        out["torch_threads"] = {"bare": bare.get("torch_threads"), "ray_train": ray_run.get("torch_threads")}

        say(f"  Ray Tune trial around Ray Train: {steps} steps")
        tune_cfg = with_overrides(ray_cfg, {"train.output_dir": str(root / "tune" / "run")})
        env = {k: os.environ[k] for k in ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR") if k in os.environ}

        def trial(config: dict) -> None:
            os.environ.update(env)
            _train(tune_cfg)

        tuner = tune.Tuner(tune.with_resources(trial, {"CPU": 0.1}),
                           tune_config=tune.TuneConfig(num_samples=1),
                           run_config=tune.RunConfig(name="bench", storage_path=str(root / "tune" / "state"),
                                                     verbose=0))
        t0 = time.perf_counter()
        results = tuner.fit()
        out["tune_trial_seconds"] = time.perf_counter() - t0
        if results.errors:
            raise RuntimeError(f"the Tune trial failed: {results.errors[0]}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for way in ("ray_train", "tune_trial"):
        out[f"{way}_ratio"] = out[f"{way}_seconds"] / out["bare_seconds"]
        out[f"{way}_overhead"] = out[f"{way}_ratio"] - 1.0
    return out

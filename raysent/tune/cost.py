"""The cost model behind every time estimate (`raysent train --dry-run`, `raysent tune --dry-run`, a suite's
plan): seconds per optimizer step of each method at a reference batch and length, per dev and test evaluation,
per run and per phase, scaled by a run's batch × length and multiplied out by its steps, runs and how many run at
once. A suite file's ``estimate`` calibrates it (benchmarks/mini.yaml holds the costs measured on 2 CPU cores);
without one, :class:`Estimate`'s defaults give a rough figure.
"""

from __future__ import annotations

import math
from pathlib import Path
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


DEFAULT_MODEL = ("1 s per step at batch 64 × length 32 (a 2-core CPU's order), scaled by batch × length; a suite "
                 "file's `estimate` calibrates it")


def rough_estimate(cfg: ExperimentConfig, searched: bool) -> dict[str, Any]:
    """Wall time of a run or search: by the `raysent bench` figures of the device it will train on, where a record
    of one is under ``<results>/bench`` (:func:`device_estimate`), else by the default cost model (a rough figure,
    and it says so); with a note where the local training data is a stand-in smaller than the hub's."""
    est, model = device_estimate(cfg)
    try:
        e = estimate_seconds(cfg, "searched" if searched else "paper", est)
    except RaysentError as exc:
        return {"unknown": str(exc)}
    out: dict[str, Any] = {"optimizer steps per run": e["steps_per_run"], "runs": e["search_runs"] + e["final_runs"],
                           "final runs that evaluate a search run": e["final_runs_reused"],
                           "trials at once": planned_concurrency(cfg), "wall minutes": round(e["seconds"] / 60, 1),
                           "model": model}
    note = stand_in_note(cfg, est)
    if note:
        out["data"] = note
    return out


def stand_in_note(cfg: ExperimentConfig, est: Estimate) -> str | None:
    """Where the run's training data is read from a local copy smaller than the set the papers train on (the
    11,914-line head of wiki1m, not its 1M lines): both sizes, and the steps a run would take on the full set."""
    from raysent.data.datasets import DATASETS, local_files, parse_spec

    spec = cfg.data.train
    if spec is None or cfg.train.max_steps or cfg.data.max_train_samples:
        return None
    name, splits = parse_spec(spec)
    decl = DATASETS.get(name)
    if decl is None or len(splits) != 1 or splits[0] not in decl.full_rows:
        return None
    files = local_files(decl, splits[0])
    if not files or files[0].name == "wiki1m_for_simcse.txt":
        return None
    full = decl.full_rows[splits[0]]
    local = len(load(spec))
    steps = cfg.train.epochs * math.ceil(full / cfg.train.batch_size)
    return (f"{spec}: the runs here read the local copy, {local:,} rows ({files[0].name}), a stand-in for the full "
            f"set's {full:,}; with the full set (the hub's, or a complete local copy) a run is {steps:,} steps")


def device_estimate(cfg: ExperimentConfig, results_dir: str | Path | None = None) -> tuple[Estimate, str]:
    """The cost model of the device ``cfg`` trains on (cuda when its trials get a GPU, else the CPU): the newest
    `raysent bench` record of such a device under ``<results>/bench`` that measured the method, its seconds per
    step scaled to this run's encoder by the encoder's parameters outside the embeddings (a step's FLOPs are about
    6N per token); and in words, which record and how. No record: the default model, saying so."""
    device = "cuda" if planned_gpus(cfg) > 0 else "cpu"
    root = Path(results_dir if results_dir is not None else cfg.tracking.results_dir) / "bench"
    figure = newest_bench_figure(root, device, cfg.method)
    if figure is None:
        return Estimate(), f"no `raysent bench` record of a {device} device under {root}: {DEFAULT_MODEL}"
    n_run = encoder_params(cfg.model.name)
    scale = n_run / figure["params"] if n_run and figure["params"] else 1.0
    seconds = scale / figure["steps_per_second"]
    est = Estimate(device=figure["device"], step_seconds={cfg.method: seconds, "default": seconds},
                   reference_batch=figure["batch"], reference_length=figure["length"])
    scaled = (f", scaled by the encoder's non-embedding parameters ({figure['params'] / 1e6:.1f}M there, "
              f"{n_run / 1e6:.1f}M here)" if n_run and figure["params"] else " (this model's size is not known here: "
              "not scaled)")
    return est, (f"raysent bench {figure['file']} ({figure['device']}): {figure['method']} "
                 f"{figure['steps_per_second']:.2f} steps/s on {figure['model']} at batch {figure['batch']} × length "
                 f"{figure['length']}, {figure['precision']}{scaled}, and by batch × length")


def newest_bench_figure(root: Path, device: str, method: str) -> dict[str, Any] | None:
    """The newest measurement of ``method`` (else of any method) on ``device`` in the bench records under ``root``:
    the training part's case of the method, else the gpu part's default case (simcse-unsup)."""
    import json

    fallback = None
    for path in sorted(root.glob("*.json"), reverse=True):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        machine = record.get("machine") or {}
        if (machine.get("cuda") is not None) != (device == "cuda"):
            continue
        options = record.get("options") or {}
        cases: dict[str, Any] = dict((record.get("training") or {}).get("methods") or {})
        gpu_default = ((record.get("gpu") or {}).get("cases") or {}).get("defaults")
        if gpu_default and "simcse-unsup" not in cases:
            cases["simcse-unsup"] = gpu_default
        for name, case in cases.items():
            if not case.get("steps_per_second"):
                continue
            figure = {"file": f"results/bench/{path.name}", "device": machine.get("cuda") or
                      f"CPU, {case.get('threads') or machine.get('cpus')} thread(s)", "method": name,
                      "steps_per_second": float(case["steps_per_second"]), "model": options.get("model", "?"),
                      "batch": int(options.get("batch_size", 64)), "length": int(options.get("max_length", 32)),
                      "precision": case.get("precision", "?"), "params": case.get("encoder_params_non_embedding")}
            if name == method:
                return figure
            fallback = fallback or figure
    return fallback


# (layers, hidden, intermediate) of the papers' encoders, from their config.json on the hub: the size of a model that
# is not here yet (a dry run before its download)
KNOWN_SHAPES = {"bert-base-uncased": (12, 768, 3072), "bert-base-cased": (12, 768, 3072),
                "bert-large-uncased": (24, 1024, 4096), "bert-large-cased": (24, 1024, 4096),
                "roberta-base": (12, 768, 3072), "roberta-large": (24, 1024, 4096)}


def encoder_params(model: str) -> int | None:
    """About the parameters of a BERT-like encoder outside its embeddings, from its config.json, or for the papers'
    encoders their known shape (None: not known here): layers × (4h² attention + 2h·i feed-forward)."""
    import json

    from raysent.models.locate import resolve_model

    where, _ = resolve_model(model)
    config = Path(where) / "config.json"
    if not config.is_file():
        shape = KNOWN_SHAPES.get(model.split("/")[-1])
        return None if shape is None else shape[0] * (4 * shape[1] ** 2 + 2 * shape[1] * shape[2])
    c = json.loads(config.read_text(encoding="utf-8"))
    h, layers, inter = c.get("hidden_size"), c.get("num_hidden_layers"), c.get("intermediate_size")
    if not (isinstance(h, int) and isinstance(layers, int) and isinstance(inter, int)):
        return None
    return layers * (4 * h * h + 2 * h * inter)

"""What a search will do, worked out once from its config (:class:`SearchPlan`), and the plan
``raysent tune --dry-run`` prints (:func:`dry_run`).

The warm-start configuration (``search.warm_start: paper``: the experiment's own values of its searched entries,
tried first), a grid's points, the seeds each configuration runs on, whether a trial trains them all in turns
(:func:`raysent.tune.trial.seeds_in_one_trial`), and how many Tune trials and training runs that makes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from raysent.config import ExperimentConfig
from raysent.tracking import redact, tracking_uri
from raysent.train.packing import Packing
from raysent.tune.diskspace import in_words, space_needed
from raysent.tune.space import grid, paper_point
from raysent.tune.trial import search_seeds, seeds_in_one_trial


@dataclass(frozen=True)
class SearchPlan:
    """A search's shape; ``None`` parts where the config has no search."""

    algorithm: str
    warm: dict | None  # the warm-start configuration, tried first (None: off, or it cannot be tried)
    warm_note: str  # why it cannot be tried ("" when it can, or when warm start is off)
    points: list[dict] | None  # a grid's configurations, the warm-start one first (added when the grid lacks it)
    seeds: list[int]  # each configuration's seeds
    together: bool  # one trial trains a configuration's seeds in turns (a scheduler stops them on their mean)
    configurations: int
    startup_note: str = ""  # TPE or GP that draws every configuration at random (search.n_startup_trials)

    @property
    def runs(self) -> int:
        """Training runs at most (a scheduler stops some): every configuration on every seed."""
        return self.configurations * len(self.seeds)

    @property
    def trials(self) -> int:
        """Tune trials: one per run, or one per configuration when a trial trains all its seeds."""
        return self.configurations if self.together else self.runs

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> SearchPlan:
        s = cfg.search
        if s is None:
            return cls("none", None, "", None, [], False, 0)
        warm, note = None, ""
        if s.warm_start == "paper":
            point, outside = paper_point(cfg)
            if point is None or (outside and s.algorithm != "grid"):
                note = outside or "a value is unset"
            else:
                warm = point
        points = None
        if s.algorithm == "grid":
            points = grid(s.space)
            if warm is not None:
                points = [warm, *(p for p in points if p != warm)]
        startup = ""
        if s.algorithm in ("optuna-tpe", "optuna-gp"):
            n = 10 if s.n_startup_trials is None else s.n_startup_trials  # Optuna's default for both
            if n >= s.num_samples:
                startup = (f"{s.algorithm} draws its first {n} configurations at random (search.n_startup_trials"
                           f"{'' if s.n_startup_trials is not None else ': null, Optuna default 10'}) and this search "
                           f"tries {s.num_samples}: it is random search; set search.n_startup_trials below "
                           "num_samples for the model to choose any")
        return cls(algorithm=s.algorithm, warm=warm, warm_note=note, points=points, seeds=search_seeds(cfg),
                   together=seeds_in_one_trial(cfg),
                   configurations=len(points) if points is not None else s.num_samples, startup_note=startup)


class _Plan(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


_SAMPLERS = {"optuna-tpe": "TPESampler", "optuna-gp": "GPSampler", "random": "RandomSampler"}


def sampler_settings(cfg: ExperimentConfig) -> dict[str, Any] | None:
    """The Optuna sampler of ``search.algorithm`` and every option raysent gives it (None: a grid, Tune's own):
    recorded on the search (state.json, summary.json, the dry run). Options whose default changed between Optuna 4
    and 5 are given, so a file searches alike under both: TPE's ``multivariate`` and ``constant_liar`` (both off in
    4.x, on in 5.0; constant_liar lets trials that run at once see each other as running, so two of them are not the
    same guess). Optuna 5's GPSampler accounts for running trials and 4.x's does not, with no option for it: the one
    difference left, said in docs/search.md."""
    s = cfg.search
    assert s is not None
    if s.algorithm not in _SAMPLERS:
        return None
    out: dict[str, Any] = {"sampler": _SAMPLERS[s.algorithm], "seed": s.seed}
    if s.algorithm == "optuna-tpe":
        out.update(multivariate=True, constant_liar=True)
    if s.algorithm in ("optuna-tpe", "optuna-gp") and s.n_startup_trials is not None:  # unset: Optuna's 10
        out["n_startup_trials"] = s.n_startup_trials
    return out



class SearchPart(_Plan):
    algorithm: str
    configurations: int
    first: dict[str, Any] | str = Field(alias="first configuration (search.warm_start)")
    seeds_per_configuration: int | str = Field(alias="seeds per configuration")
    trials: int
    runs: int
    metric: str
    space: dict[str, dict[str, Any]]
    scheduler: dict[str, Any] | None
    pruner: dict[str, Any] | None = None
    n_startup_trials: int | str | None = None
    note: str | None = None
    max_concurrent_trials: int | str
    sampler: dict[str, Any] | None = None  # Optuna's sampler and the options raysent gives it (None: a grid)


class FinalPart(_Plan):
    seeds: list[int]
    runs: int
    evaluation: list[str]


class DryRun(_Plan):
    """What `raysent tune --dry-run` prints (the checks and the estimate are added beside it)."""

    experiment: str
    method: str
    model: str
    train_data: str | None
    search: SearchPart | None
    final: FinalPart
    resources: dict[str, Any]  # what a trial asks for, the device it trains on, trials at once (resources_part)
    results: str
    run_records: str = Field(alias="run records")
    trial_checkpoints: str = Field(alias="trial checkpoints")
    disk_space: str = Field(alias="disk space")
    mlflow: str
    ray: str

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, mode="json")


def cached_packing(cfg: ExperimentConfig, exp: Path | None, cluster: dict[str, float] | None,
                   trials: int | None) -> Packing | None:
    """What ``gpus_per_worker: auto`` packs per GPU by the GPU probe a search of this experiment cached
    (:mod:`raysent.tune.gpu_probe`); None when nothing was measured for these trial settings (a dry run probes
    nothing)."""
    from raysent.train.packing import choose, most_per_gpu
    from raysent.train.resources import packable
    from raysent.tune.gpu_probe import load_cached, probe_key

    if exp is None or cluster is None or not packable(cfg) or cluster.get("GPU", 0.0) <= 0:
        return None
    asked = cfg.search.max_concurrent_trials if cfg.search is not None else 1
    most = most_per_gpu(cluster["GPU"], cluster.get("CPU", 0.0), cfg.resources.cpus_per_worker, trials,
                        None if asked == "auto" else int(asked))
    probe = load_cached(exp, probe_key(cfg), most) if most > 1 else None
    return choose(probe, most) if probe is not None else None


def resources_part(cfg: ExperimentConfig, search_trials: int | None, exp: Path | None = None) -> dict[str, Any]:
    """What each trial asks for, the device it trains on, how many trials share a GPU and how many run at once in
    each phase, on the Ray this process is connected to, else on this machine (a local Ray), else (a cluster joined
    by address) as far as the config tells; ``auto``'s trials per GPU as the GPU probe a search of ``exp`` cached
    them."""
    from raysent.preflight import available_resources
    from raysent.train.resources import placement

    r = cfg.resources
    remote = bool(r.address or os.environ.get("RAY_ADDRESS"))
    cluster: dict[str, float] | None
    cluster, where = available_resources()
    if remote and not where.startswith("the Ray cluster"):
        cluster, where = None, "the Ray cluster"
    packing = cached_packing(cfg, exp, cluster, search_trials or len(cfg.seeds))
    final = placement(cfg, cluster, where, trials=len(cfg.seeds), packing=packing)
    gpus: Any = final.gpus()
    out: dict[str, Any] = ({"trial driver CPU": r.trial_cpus, "Ray Train workers": r.workers,
                            "CPU per worker": r.cpus_per_worker, "GPU per worker": gpus}
                           if r.workers else {"CPU": r.cpus_per_worker, "GPU": gpus})
    out["trains on"] = final.device
    if final.trials_per_gpu:
        out["trials per GPU"] = final.trials_per_gpu
    phases = ([("search", placement(cfg, cluster, where, trials=search_trials, packing=packing))]
              if search_trials else []) + [("final", final)]
    at_once = {name: f"{p.at_once} ({p.limit})" for name, p in phases if p.at_once is not None}
    out["trials at once"] = at_once or f"not known until the run joins the cluster ({where})"
    if cluster is not None:
        out["cluster"] = {**cluster, "in": where}
    return out


def _most_at_once(resources: dict[str, Any]) -> int | None:
    """The most trials at once of any phase in :func:`resources_part`'s answer ("2 (the 2 CPUs)"), None unknown."""
    phases = resources.get("trials at once")
    counts = [int(v.split()[0]) for v in phases.values()] if isinstance(phases, dict) else []
    return max(counts, default=None)


def dry_run(cfg: ExperimentConfig, exp: Path, final_only: bool = False) -> DryRun:
    s = cfg.search
    searched = not final_only and s is not None
    search = None
    search_trials = None
    search_runs = 0
    if searched and s is not None:
        p = SearchPlan.of(cfg)
        search_trials, search_runs = p.trials, p.runs
        search = SearchPart(
            algorithm=s.algorithm, configurations=p.configurations, first=p.warm or "none",
            seeds_per_configuration=(f"{s.seeds} (in one trial, in turns: the "
                                     + ("scheduler stops configurations on their seed mean)" if s.scheduler else
                                        "pruner tests their per-seed scores)") if p.together else s.seeds),
            trials=p.trials, runs=p.runs, metric=f"{s.metric} ({s.mode})",
            space={k: {f: v for f, v in e.model_dump().items() if v is not None} for k, e in s.space.items()},
            scheduler=s.scheduler.model_dump() if s.scheduler else None,
            pruner=s.pruner.model_dump() if s.pruner else None,
            n_startup_trials=(s.n_startup_trials if s.n_startup_trials is not None else "Optuna's default (10)")
            if s.algorithm in ("optuna-tpe", "optuna-gp") else None,
            note=p.startup_note or None, max_concurrent_trials=s.max_concurrent_trials,
            sampler=sampler_settings(cfg))
    resources = resources_part(cfg, search_trials, exp)
    return DryRun(
        experiment=exp.name, method=cfg.method, model=cfg.model.name, train_data=cfg.data.train, search=search,
        final=FinalPart(seeds=list(cfg.seeds), runs=len(cfg.seeds), evaluation=list(cfg.eval.tasks)),
        resources=resources, results=str(exp), run_records=str(exp / "runs"),
        trial_checkpoints=("kept" if s is not None and s.keep_checkpoints else
                           "deleted once a trial's record and best model are saved (search.keep_checkpoints)"),
        disk_space=in_words(space_needed(cfg, search_runs, _most_at_once(resources))),
        mlflow=redact(tracking_uri(cfg)) if cfg.tracking.enabled else "off",
        ray=cfg.resources.address or os.environ.get("RAY_ADDRESS") or "local")

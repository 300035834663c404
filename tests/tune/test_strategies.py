"""Search strategies: ``search.algorithm`` (optuna-tpe, optuna-gp, random, grid; ``optuna`` read as optuna-tpe),
``search.pruner: wilcoxon`` (Optuna's WilcoxonPruner over per-seed dev scores, decided in a Tune scheduler), the
combinations that cannot work refused with the file and the field, and real searches that use them: the pruner
stops exactly the configurations Optuna's own pruner stops, and every search's summary, summary.md, model card and
MLflow parent run carry its budget curve."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from raysent.config import load_config, parse_config
from raysent.errors import ConfigError
from raysent.tune.wilcoxon import WilcoxonDecision

from conftest import RAW_BERT
from conftest import tiny_experiment as experiment

BASE = {"name": "s", "method": "simcse-unsup", "model": {"name": RAW_BERT},
        "train": {"max_steps": 40, "eval_every": 10}}
SPACE = {"lr": {"type": "loguniform", "low": 1.0e-5, "high": 1.0e-4}}


def _write(tmp_path: Path, search: str, train: str = "{max_steps: 40, eval_every: 10}") -> Path:
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: s\nmethod: simcse-unsup\nmodel: {{name: {RAW_BERT}}}\ntrain: {train}\n"
                    f"search:\n{search}\n  space:\n    lr: {{type: loguniform, low: 1.0e-5, high: 1.0e-4}}\n")
    return path


def _refused(path: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(path)
    return str(exc.value)


@pytest.mark.shared
def test_one_name_per_algorithm_and_the_old_optuna_is_optuna_tpe(tmp_path):
    old = load_config(_write(tmp_path, "  algorithm: optuna"))
    assert old.search.algorithm == "optuna-tpe" and old.to_dict()["search"]["algorithm"] == "optuna-tpe"
    for name in ("optuna-tpe", "optuna-gp", "random"):
        assert load_config(_write(tmp_path, f"  algorithm: {name}")).search.algorithm == name
    msg = _refused(_write(tmp_path, "  algorithm: tpe"))
    assert "exp.yaml:6" in msg and "search.algorithm" in msg
    assert all(f"'{a}'" in msg for a in ("optuna-tpe", "optuna-gp", "random", "grid"))
    pruned = load_config(_write(tmp_path, "  seeds: 2\n  pruner: wilcoxon"))
    assert pruned.search.pruner.type == "wilcoxon" and pruned.search.pruner.p_threshold == 0.1
    assert pruned.search.early_stopping is pruned.search.pruner


@pytest.mark.shared
def test_the_combinations_that_cannot_work_are_refused_naming_the_file_and_field(tmp_path):
    one_seed = _refused(_write(tmp_path, "  seeds: 1\n  pruner: wilcoxon"))
    assert "exp.yaml:7: search.pruner: wilcoxon" in one_seed and "search.seeds >= 2, got search.seeds 1" in one_seed
    both = _refused(_write(tmp_path, "  seeds: 2\n  pruner: wilcoxon\n  scheduler: {type: asha}"))
    assert "exp.yaml:7: search.pruner:" in both and "search.scheduler (asha)" in both and "allowed: one of them" in both
    # 2 seeds x 1 evaluation before the end (steps 20 of 40): 2 pairs, and p < 0.1 needs 4
    never = _refused(_write(tmp_path, "  seeds: 2\n  pruner: wilcoxon", train="{max_steps: 40, eval_every: 20}"))
    assert "search.pruner: wilcoxon can never stop a configuration" in never and "the test needs 4" in never
    # ... which a larger p_threshold allows (1/2^2 = 0.25 < 0.3)
    ok = _write(tmp_path, "  seeds: 2\n  pruner: {type: wilcoxon, p_threshold: 0.3}", train="{max_steps: 40, "
                "eval_every: 20}")
    assert load_config(ok).search.pruner.p_threshold == 0.3
    grid = _refused(_write(tmp_path, "  algorithm: grid"))
    assert "exp.yaml:6: search.algorithm: grid needs 'choice' entries only; not: lr (their type: loguniform)" in grid
    assert "optuna-tpe, optuna-gp or random" in grid
    path = tmp_path / "grid.yaml"
    path.write_text(f"name: s\nmethod: simcse-unsup\nmodel: {{name: {RAW_BERT}}}\nsearch:\n  algorithm: grid\n"
                    "  n_startup_trials: 2\n  space:\n    lr: {type: choice, values: [1.0e-5]}\n")
    assert "grid.yaml:6: search.n_startup_trials: got 2: it is for optuna-tpe and optuna-gp" in _refused(path)
    unknown = _refused(_write(tmp_path, "  seeds: 2\n  pruner: median"))
    assert "search.pruner.type" in unknown and "'wilcoxon'" in unknown
    workers = tmp_path / "w.yaml"
    workers.write_text(_write(tmp_path, "  seeds: 2\n  pruner: wilcoxon").read_text() + "resources: {workers: 2}\n")
    assert "resources.workers: got 2: with search.pruner" in _refused(workers)


@pytest.mark.shared
def test_the_samplers_and_the_plan(tmp_path):
    import optuna

    from raysent.tune.plan import SearchPlan, dry_run
    from raysent.tune.searchers import sampler_of

    def cfg(**search):
        return parse_config({**BASE, "search": {"space": SPACE, **search}})

    tpe = sampler_of(cfg(algorithm="optuna", n_startup_trials=3, seed=4))
    assert isinstance(tpe, optuna.samplers.TPESampler) and tpe._n_startup_trials == 3 and tpe._multivariate is True
    # Optuna 5's defaults, given explicitly: a file searches alike under Optuna 4 (both off there)
    assert tpe._constant_liar is True
    assert dry_run(cfg(algorithm="optuna", n_startup_trials=3, seed=4), tmp_path / "t").to_dict()["search"][
        "sampler"] == {"sampler": "TPESampler", "seed": 4, "multivariate": True, "constant_liar": True,
                       "n_startup_trials": 3}
    assert dry_run(cfg(algorithm="random"), tmp_path / "r").to_dict()["search"]["sampler"] == {
        "sampler": "RandomSampler", "seed": 0}
    gp = sampler_of(cfg(algorithm="optuna-gp", n_startup_trials=2))
    assert isinstance(gp, optuna.samplers.GPSampler) and gp._n_startup_trials == 2
    assert isinstance(sampler_of(cfg(algorithm="random")), optuna.samplers.RandomSampler)
    assert isinstance(sampler_of(cfg(algorithm="optuna-gp")), optuna.samplers.GPSampler)  # Optuna's default startup
    # TPE or GP whose startup covers the whole budget is random search: the plan says so
    note = SearchPlan.of(cfg(algorithm="optuna-gp", num_samples=8)).startup_note
    assert "it is random search" in note and "Optuna default 10" in note
    assert SearchPlan.of(cfg(algorithm="optuna-gp", num_samples=8, n_startup_trials=3)).startup_note == ""
    assert SearchPlan.of(cfg(algorithm="random", num_samples=8)).startup_note == ""
    c = cfg(algorithm="optuna-tpe", num_samples=8, seeds=2, pruner="wilcoxon")
    plan = dry_run(c, tmp_path / "s").to_dict()["search"]
    assert plan["pruner"]["type"] == "wilcoxon" and plan["n_startup_trials"] == "Optuna's default (10)"
    assert plan["trials"] == 8 and plan["runs"] == 16 and "pruner tests their per-seed scores" in \
        plan["seeds per configuration"] and "random search" in plan["note"]


def _optuna_decisions(trials: list[list[dict[int, float]]], mode: str, p: float) -> list[int | None]:
    """Optuna's own WilcoxonPruner in an Optuna study: each trial reports its instances round by round and asks
    should_prune after each round but the last; returns the round it was pruned after (None: ran to its end, and
    was told the mean of its values)."""
    import warnings

    import optuna

    out: list[int | None] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction="maximize" if mode == "max" else "minimize",
                                    pruner=optuna.pruners.WilcoxonPruner(p_threshold=p))
    for rounds in trials:
        t = study.ask()
        pruned = None
        for k, values in enumerate(rounds, 1):
            for inst, v in values.items():
                t.report(v, inst)
            if k < len(rounds) and t.should_prune():
                pruned = k
                break
        out.append(pruned)
        if pruned is None:
            study.tell(t, float(np.mean([v for r in rounds for v in r.values()])))
        else:
            study.tell(t, state=optuna.trial.TrialState.PRUNED)
    return out


@pytest.mark.parametrize("mode", ["max", "min"])
def test_the_decision_is_optunas_wilcoxon_pruner(mode):
    """Rounds of per-seed points, replayed through WilcoxonDecision, stop each configuration after the round where
    Optuna's WilcoxonPruner, in an Optuna study told the same values, prunes it (the best: the finished one with
    the best mean)."""
    rng = np.random.default_rng(0)
    seeds, steps = [1, 2, 3], [10, 20, 30, 40]
    configs = [rng.normal(50, 2) + rng.normal(0, 0.5, size=(len(steps), len(seeds))) for _ in range(12)]
    as_rounds = [[{si * 100 + k: float(c[k, si]) for si in range(len(seeds))} for k in range(len(steps))]
                 for c in configs]
    expected = _optuna_decisions(as_rounds, mode, 0.2)
    d = WilcoxonDecision(mode, p_threshold=0.2)
    got: list[int | None] = []
    for i, c in enumerate(configs):
        stop = None
        for k, step in enumerate(steps, 1):
            d.observe(f"t{i}", {str(s): {"step": step, "dev_spearman": float(c[k - 1, si])}
                                for si, s in enumerate(seeds)})
            if k < len(steps) and d.should_stop(f"t{i}"):
                stop = k
                break
        got.append(stop)
        if stop is None:
            d.finish(f"t{i}", float(np.mean(c)))
    assert got == expected
    assert any(g is not None for g in got) and any(g is None for g in got[1:])


def test_step_zero_is_left_out_and_a_new_stage_is_new_instances():
    d = WilcoxonDecision("max")
    d.observe("a", {"1": {"step": 0, "dev_spearman": 40.0}, "2": {"step": 0, "dev_spearman": 40.0}})
    assert d.values == {} and not d.should_stop("a")
    for step in (10, 20, 0, 10):  # a second stage starts again at step 0
        d.observe("a", {"1": {"step": step, "dev_spearman": 50.0 + step}, "2": {"step": step, "dev_spearman": 51.0}})
    assert sorted(d.instances) == ["1/0/10", "1/0/20", "1/1/10", "2/0/10", "2/0/20", "2/1/10"]
    d.finish("a", 52.0)
    worse = {str(s): {"step": st, "dev_spearman": 30.0} for s in (1, 2) for st in (10,)}
    d.observe("b", worse)
    assert not d.should_stop("b")  # 2 pairs: the smallest one-sided p is 1/4
    d.observe("b", {str(s): {"step": 20, "dev_spearman": 30.0} for s in (1, 2)})
    assert d.should_stop("b")  # 4 pairs, all worse: p = 1/16 < 0.1
    d.observe("c", {str(s): {"step": st, "dev_spearman": 99.0} for s in (1, 2) for st in (10,)})
    d.observe("c", {str(s): {"step": 20, "dev_spearman": 99.0} for s in (1, 2)})
    assert not d.should_stop("c")
    # at a run's last evaluation stopping saves nothing: the configuration finishes
    end = WilcoxonDecision("max", last=(0, 20))
    end.observe("a", {"1": {"step": 10, "dev_spearman": 50.0}, "2": {"step": 10, "dev_spearman": 50.0}})
    end.observe("a", {"1": {"step": 20, "dev_spearman": 50.0}, "2": {"step": 20, "dev_spearman": 50.0}})
    end.finish("a", 50.0)
    end.observe("b", {"1": {"step": 10, "dev_spearman": 30.0}, "2": {"step": 10, "dev_spearman": 30.0}})
    end.observe("b", {"1": {"step": 20, "dev_spearman": 30.0}, "2": {"step": 20, "dev_spearman": 30.0}})
    assert end.at_end("b") and not end.should_stop("b")


# --------------------------------------------------------------------------- real searches
WILCOXON_SEARCH = """\
  algorithm: grid
  warm_start: none
  seeds: 2
  max_concurrent_trials: 1   # one configuration after another: the pruner's decisions can be replayed
  pruner: wilcoxon
  space:
    lr: {type: choice, values: [3.0e-4, 1.0e-9, 2.0e-4]}
"""


@pytest.mark.slow
@pytest.mark.shared
def test_wilcoxon_pruning_search_records_stops_and_publishes_its_budget_curve(ray_cluster, tmp_path):
    """A real search with search.pruner: wilcoxon: each configuration trains its 2 seeds in turns; the scheduler
    stops what Optuna's WilcoxonPruner stops (replayed from the records); the stopped seeds are recorded; the
    summary, summary.md, the model card and the MLflow parent run carry the budget curve, whose steps are what
    the runs trained."""
    from mlflow.tracking import MlflowClient

    from raysent.tune.driver import tune_experiment

    cfg = load_config(experiment(tmp_path, "wx", WILCOXON_SEARCH, "[1, 2]", sts_sets="[stsb]", max_steps=8,
                                  tracking=", log_model: none"))  # the card and parent run, no model logged
    summary = tune_experiment(cfg, quiet=True)
    exp = tmp_path / "results" / "wx"
    records = [json.loads(p.read_text()) for p in sorted((exp / "runs").glob("search-*.json"))]
    stopped = [json.loads(p.read_text()) for p in sorted((exp / "stopped").glob("search-*.json"))]
    configs: dict[str, list[dict]] = {}
    for r in records + stopped:
        configs.setdefault(r["config_id"], []).append(r)
    assert len(configs) == 3 and all(sorted(r["seed"] for r in rs) == [1, 2] for rs in configs.values())
    assert stopped and all(r["stopped"]["at_step"] < 8 for r in stopped)
    # replay, one configuration after another as they ran: Optuna's pruner, told the configurations that finished
    # before, stops each stopped configuration at the round it was stopped at, and no configuration earlier
    d = WilcoxonDecision("max")
    for cid, rs in sorted(configs.items(), key=lambda kv: min(r["finished_at"] for r in kv[1])):
        end = rs[0]["stopped"]["at_step"] if rs[0].get("stopped") else 8
        rounds = sorted({p["step"] for p in rs[0]["dev_curve"] if p["step"] <= end})
        for step in rounds:
            d.observe(cid, {str(r["seed"]): next(p for p in r["dev_curve"] if p["step"] == step) for r in rs})
            stops = d.should_stop(cid) if step < 8 else False
            assert stops == (step == end and bool(rs[0].get("stopped"))), (cid, step, rs[0]["hp"])
        if not rs[0].get("stopped"):
            d.finish(cid, float(np.mean([r["best_dev_spearman"] for r in rs])))
    at = stopped[0]["stopped"]["at_step"]

    # the budget curve: 3 configurations, the stopped one at its score so far; steps: what every seed trained
    b = summary.budget
    assert b is not None and b.configurations == 3 and b.stopped_configurations == 1
    assert b.steps_total == 2 * 8 * 2 + 2 * at and b.seeds_per_configuration == 2 and b.flattened is not None
    assert summary.best.config_id not in {r["config_id"] for r in stopped}
    assert b.at(3) == pytest.approx(max(b.scores)) and b.seed_sd_from == "search"
    saved = json.loads((exp / "summary.json").read_text())["budget"]
    assert saved["expected_best"] == pytest.approx(b.expected_best)
    md = (exp / "summary.md").read_text()
    assert "## Budget curve" in md and b.verdict in md and (exp / "plots" / "budget.png").is_file()
    card = (Path(summary.published.best_model_dir) / "README.md").read_text()
    assert "### Budget curve" in card and b.verdict in card
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    run = client.get_run(summary.published.parent_run_id)
    for n in (1, 2, 3):
        assert run.data.metrics[f"budget/expected_best_at_{n}"] == pytest.approx(b.at(n))
    assert run.data.metrics["budget/steps_total"] == b.steps_total
    assert [m.step for m in client.get_metric_history(run.info.run_id, "budget/expected_best")] == [1, 2, 3]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert "budget.md" in artifacts and "plots/budget.png" in plots


GP_SEARCH = """\
  algorithm: optuna-gp
  n_startup_trials: 1
  max_concurrent_trials: 1  # one after another: a trial asked while the first still runs is another random start
  warm_start: none
  seed: 3
  num_samples: 3
  seeds: 1
  space:
    lr: {type: loguniform, low: 1.0e-6, high: 3.0e-4}
    temperature: {type: uniform, low: 0.03, high: 0.1}
"""


@pytest.mark.slow
@pytest.mark.shared
def test_a_gp_search_runs_its_trials_with_optunas_gp_sampler(ray_cluster, tmp_path):
    """search.algorithm: optuna-gp: the first configuration is its random start, the next two the GP's (not what
    Optuna's RandomSampler with the same seed draws next); the study and the budget curve hold all three."""
    import warnings

    import optuna

    from raysent.tune.driver import tune_experiment

    cfg = load_config(experiment(tmp_path, "gp", GP_SEARCH, "[1]", sts_sets="[stsb]", max_steps=2))
    summary = tune_experiment(cfg, quiet=True, search_only=True)
    exp = tmp_path / "results" / "gp"
    study = optuna.load_study(study_name=f"search-{summary.search}", storage=f"sqlite:///{exp / 'optuna.db'}")
    done = sorted((t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE), key=lambda t: t.number)
    assert len(done) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rand = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3), direction="maximize")
    drawn = []
    for _ in range(3):  # as raysent's define-by-run space asks: lr, then temperature
        t = rand.ask()
        drawn.append(t.suggest_float("lr", 1.0e-6, 3.0e-4, log=True))
        t.suggest_float("temperature", 0.03, 0.1)
        rand.tell(t, 0.0)
    assert done[0].params["lr"] == pytest.approx(drawn[0])  # GP's start: its RandomSampler with the same seed
    assert all(t.params["lr"] != pytest.approx(x) for t, x in zip(done[1:], drawn[1:]))
    assert summary.budget is not None and summary.budget.configurations == 3
    assert summary.budget.steps_total == 3 * 2


def test_the_estimate_is_for_the_device_the_trials_train_on_and_names_its_bench_record(tmp_path, monkeypatch):
    """A GPU's bench record prices a GPU run, a CPU's a CPU run, each scaled to the run's encoder; a local stand-in of
    wiki1m is named with the full set's steps."""
    import json

    from raysent.tune import cost

    bench = tmp_path / "bench"
    bench.mkdir()
    case = {"steps": 10, "seconds": 1.0, "sentences_per_second": 1.0, "peak_rss_mib": 1.0, "cuda_peak_mib": None,
            "precision": "bf16", "encoder_params_non_embedding": 85_000_000}
    (bench / "20261127-141715.json").write_text(json.dumps({
        "options": {"model": "bert-base-random", "batch_size": 64, "max_length": 32},
        "machine": {"cuda": "NVIDIA H200", "cpus": 16},
        "training": {"methods": {"simcse-unsup": {**case, "steps_per_second": 20.0}}}}))
    (bench / "20261127-150950.json").write_text(json.dumps({
        "options": {"model": "paraphrase-MiniLM-L3-v2", "batch_size": 64, "max_length": 32},
        "machine": {"cuda": None, "cpus": 2},
        "training": {"methods": {"simcse-unsup": {**case, "steps_per_second": 1.0, "precision": "fp32",
                                                  "encoder_params_non_embedding": 5_000_000}}}}))
    base = {**BASE, "model": {"name": "bert-base-uncased"}, "data": {"train": "wiki1m"},
            "train": {"batch_size": 64}, "tracking": {"results_dir": str(tmp_path)}}
    on_gpu = parse_config({**base, "resources": {"gpus_per_worker": 1}})
    est, said = cost.device_estimate(on_gpu)
    n = 12 * (4 * 768 ** 2 + 2 * 768 * 3072)  # BERT-base's non-embedding parameters, from its shape
    assert est.step_seconds["simcse-unsup"] == pytest.approx(n / 85e6 / 20.0)
    assert said.startswith("raysent bench results/bench/20261127-141715.json (NVIDIA H200): simcse-unsup 20.00 "
                           "steps/s on bert-base-random at batch 64 × length 32, bf16, scaled by the encoder's")
    on_cpu = parse_config({**base, "resources": {"gpus_per_worker": 0}})
    est, said = cost.device_estimate(on_cpu)
    assert est.step_seconds["simcse-unsup"] == pytest.approx(n / 5e6) and "(CPU, 2 thread(s))" in said
    monkeypatch.setattr(cost, "planned_concurrency", lambda cfg: 1)
    rough = cost.rough_estimate(on_cpu, searched=False)
    assert rough["data"].startswith("wiki1m: the runs here read the local copy, 11,914 rows") and \
        rough["data"].endswith("a run is 15,625 steps")
    (bench / "20261127-141715.json").unlink()
    assert cost.device_estimate(on_gpu)[1].startswith("no `raysent bench` record of a cuda device under ")

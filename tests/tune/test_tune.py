"""`raysent tune` for real, with tiny budgets: Optuna sees the mean over the search seeds, every seed
is its own result file and MLflow run, the final phase uses the best configuration, a diverging
trial fails while the search completes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from raysent.config import load_config
from raysent.tune.trial import GATE_VAR

from conftest import REPO, cli_in_process, json_summary_last
from conftest import tiny_experiment as experiment

pytestmark = [pytest.mark.slow, pytest.mark.shared]


def record(path: Path) -> dict:
    """A run record as read (its folders absolute), as plain data."""
    from raysent.train.records import read_record

    return read_record(path).model_dump(mode="json")


SEARCH = """\
  algorithm: optuna
  warm_start: none   # the order below is Optuna's own (search.warm_start is tested on its own)
  seed: 2            # Optuna's first three suggestions: two good configurations, then temperature 1e-45
  num_samples: 3
  seeds: 2
  space:
    temperature: {type: choice, values: [0.05, 1.0e-45]}   # 1e-45: cos/τ overflows, the loss is NaN
    lr: {type: loguniform, low: 1.0e-5, high: 1.0e-4}
"""


def test_search_seeds_failures_final_phase_and_mlflow(ray_cluster, tiny_bert, tmp_path):
    import optuna
    from mlflow.tracking import MlflowClient

    from raysent.tune.driver import tune_experiment

    # plumbing, not learning: the tiny random BERT (conftest.tiny_bert)
    cfg = load_config(experiment(tmp_path, "tiny", SEARCH, "[7, 8]", tracking=", log_model: all", model=tiny_bert))
    summary = tune_experiment(cfg, quiet=True).model_dump(mode="json")  # what summary.json holds
    exp = tmp_path / "results" / "tiny"
    records = [record(p) for p in sorted((exp / "runs").glob("*.json"))]
    search = [r for r in records if r["phase"] == "search"]
    final = [r for r in records if r["phase"] == "final"]

    # 3 configurations × 2 seeds; the NaN configuration's two trials failed, with the reason
    assert len(search) == 4 and {r["seed"] for r in search} == {7, 8}
    assert all(r["hp"]["temperature"] == 0.05 for r in search)
    failed = summary["best"]["failed"]
    assert len(failed) == 2 and all("loss became nan" in f["error"] for f in failed)

    # Optuna was told the mean over the two seeds of each configuration; the NaN one failed
    study = optuna.load_study(study_name=f"search-{summary['search']}", storage=f"sqlite:///{exp / 'optuna.db'}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(study.trials) == 3 and len(done) == 2
    for t in done:
        seeds = [r["best_dev_spearman"] for r in search if r["hp"]["lr"] == pytest.approx(t.params["lr"])]
        assert len(seeds) == 2 and seeds[0] != seeds[1]
        assert t.value == pytest.approx(np.mean(seeds), abs=1e-9)

    # the final phase ran the best configuration (highest mean) on every seed, on the 7 test sets
    means = {r["config_id"]: np.mean([s["best_dev_spearman"] for s in search if s["config_id"] == r["config_id"]])
             for r in search}
    best = max(means, key=means.get)
    assert summary["best"]["config_id"] == best
    assert sorted(r["seed"] for r in final) == [7, 8] and {r["config_id"] for r in final} == {best}
    assert all(r["hp"] == summary["best"]["hp"] for r in final)
    for r in final:
        assert {f"sts/{t}" for t in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")} <= set(r["scores"])
    stsb = [r["scores"]["sts/stsb"] for r in final]
    assert summary["final"]["scores"]["sts/stsb"]["mean"] == pytest.approx(np.mean(stsb))
    assert summary["final"]["scores"]["sts/stsb"]["std"] == pytest.approx(np.std(stsb, ddof=1))
    assert (exp / "best.yaml").is_file()
    # each finished trial keeps its best model; its resume checkpoint (model + optimizer) is deleted
    for r in records:
        assert (Path(r["best_model_dir"]) / "model.safetensors").is_file()
        assert not (Path(r["best_model_dir"]).parent / "checkpoint").exists()

    # MLflow: a run per seed under a run per configuration under the search's parent run
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("tiny").experiment_id
    runs = {r.info.run_id: r for r in client.search_runs([exp_id], max_results=100)}
    for rec in records:
        run = runs[rec["mlflow_run_id"]]
        assert run.data.tags["seed"] == str(rec["seed"]) and run.data.tags["phase"] == rec["phase"]
        assert run.data.tags["transductive"] == "true" and run.data.params["temperature"] == "0.05"
        parent = runs[run.data.tags["mlflow.parentRunId"]]
        assert parent.data.tags["config_id"] == rec["config_id"]
        assert runs[parent.data.tags["mlflow.parentRunId"]].info.run_name.startswith("search-")
        assert parent.info.run_name == f"{rec['phase']}: " + " ".join(
            f"{k}={v:.3g}" for k, v in sorted(rec["hp"].items()))  # named like its seeds: `search: lr=…`
        curve = client.get_metric_history(rec["mlflow_run_id"], "dev_spearman")
        assert [m.step for m in curve] == [p["step"] for p in rec["dev_curve"]] == [2, 4]
    assert all(f"sts/{t}" in runs[r["mlflow_run_id"]].data.metrics for r in final for t in ("stsb", "sickr"))
    # ... named by what differs, with the outcome as tags; a configuration's run has the seeds it averages,
    # not one seed; every run ended, the search's parent as FINISHED; artifacts under results/, not ./mlruns
    for rec in records:
        run = runs[rec["mlflow_run_id"]]
        assert run.info.run_name.endswith(f"· seed {rec['seed']}") and "temperature=0.05" in run.info.run_name
        assert run.data.tags["learned"] == str(rec["learned"]).lower() and run.data.tags["diverged"] == "unknown"
        assert run.info.status == "FINISHED"
        config_run = runs[run.data.tags["mlflow.parentRunId"]]
        assert "seed" not in config_run.data.params and json.loads(config_run.data.params["seeds"]) == [7, 8]
    assert client.get_experiment(exp_id).artifact_location == (tmp_path / "results" / "mlartifacts").as_uri()
    assert {r.info.status for r in runs.values()} <= {"FINISHED", "FAILED"}
    # the two failed trials are there too, FAILED, with their reason
    failed_runs = [r for r in runs.values() if r.info.status == "FAILED"]
    assert len(failed_runs) == 2 and all("loss became nan" in r.data.tags["error"] for r in failed_runs)
    assert all("temperature=1e-45" in r.info.run_name for r in failed_runs)

    # tracking.log_model: all: every final seed's model is logged in its own run (sentence_transformers
    # flavour); the best one is registered, and `models:/tiny/latest` embeds as raysent eval does
    import mlflow

    logged = client.search_logged_models(experiment_ids=[exp_id])
    assert sorted(m.source_run_id for m in logged) == sorted(r["mlflow_run_id"] for r in final)
    best_final = max(final, key=lambda r: (r["best_dev_spearman"], -r["seed"]))  # a tie: the first seed
    assert client.get_model_version("tiny", "1").run_id == best_final["mlflow_run_id"]
    from raysent.tracking import fluent

    with fluent(f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"):
        model = mlflow.sentence_transformers.load_model("models:/tiny/latest")
    import raysent

    sentences = ["A man is playing a guitar.", "Someone plays an instrument.", "A cat sleeps."]
    want = raysent.load(best_final["best_model_dir"]).encode(sentences)
    got = model.encode(sentences)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 1 - 1e-5
    # the megabytes reported are those of the best-model folders logged, one per final seed (log_model: all)
    logged_mb = sum(f.stat().st_size for r in final for f in Path(r["best_model_dir"]).rglob("*") if f.is_file())
    assert summary["published"]["model"]["megabytes"] == pytest.approx(logged_mb / 2**20) and logged_mb > 0
    assert not (REPO / "mlflow.db").exists()  # nothing went to MLflow's default store in the current folder

    # a second search (here its final phase alone) adds version 2; version 1 stays as it was
    tune_experiment(cfg, quiet=True, final_only=True)
    assert client.get_model_version("tiny", "1").run_id == best_final["mlflow_run_id"]
    assert {str(v.version) for v in client.search_model_versions("name='tiny'")} == {"1", "2"}


RESUME_SEARCH = """\
  algorithm: optuna
  warm_start: none
  keep_checkpoints: true
  num_samples: 2
  seeds: 2
  max_concurrent_trials: 1
  space:
    lr: {type: loguniform, low: 1.0e-5, high: 1.0e-4}
"""


def interrupt_and_resume(ray_cluster, path: str, runs: Path, expected: int,
                         trial_per_record: bool = False) -> tuple[dict, set[str]]:
    """`raysent tune` Ctrl-C'd once its first trial has ended, then `--resume`d; returns the summary and the
    names of the run records written before the resume.
    The point is one the code signals, not a delay (on a fast machine every trial had ended 2 s after the first
    record): the trials start at a gate (``RAYSENT_TRIAL_GATE``, :func:`raysent.tune.trial.wait_at_gate`) that lets
    the first through; the second's arrival there (one trial at a time) says the first has ended and been taken
    back by Tune, and the second has not trained. Then Ctrl-C.
    ``trial_per_record``: each trial is one run record (no scheduler, one seed each), so the line that says how
    many trials had finished must count the records."""
    gate = runs.parent.parent.parent / "gate"
    gate.mkdir()
    (gate / "allow").write_text("1")
    env = {**os.environ, "RAY_ADDRESS": ray_cluster, GATE_VAR: str(gate)}
    cmd = [sys.executable, "-m", "raysent.cli", "tune", path, "--quiet"]
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (gate / "arrived-2").exists():
        time.sleep(0.2)
    assert (gate / "arrived-2").exists(), "the second trial never started"
    proc.send_signal(signal.SIGINT)  # Ctrl-C: Tune saves the search's state and stops
    _, err = proc.communicate(timeout=180)
    recorded = {p.name for p in runs.glob("search-*.json")}
    before = len(recorded)
    assert 1 <= before < expected, "the search was not interrupted midway"
    assert proc.returncode == 130 and "--resume" in err, err[-3000:]
    said = re.search(r"interrupted after (\d+) of (\d+) trial\(s\) finished \((?:\d+ failed, )?"
                     r"(?:\d+ stopped by the scheduler, )?(\d+) were running\)", err)
    assert said, err[-3000:]
    if trial_per_record:
        assert (int(said[1]), int(said[2])) == (before, expected), said[0]
    assert not list(runs.glob("final-*.json"))  # an interrupted search is not summarised or followed
    # resumed without --quiet (which silences Tune's tables too): the summary still comes after Tune's last table
    done = cli_in_process("tune", path, "--resume", "--format", "json", one_stream=True)  # joins the same Ray
    return json_summary_last(done.stdout, before="Trial status"), recorded


def test_an_interrupted_search_resumes_with_no_trial_lost_or_repeated(ray_cluster, tiny_bert, tmp_path):
    # Optuna with seeds (Tune's Repeater); a grid search, whose trials Tune creates one by one so that the
    # unstarted ones must count as missing, is interrupted and resumed in the ASHA test below. The search is the
    # point, not what it learns: the tiny random BERT
    path = experiment(tmp_path, "resumable", RESUME_SEARCH, "[1]", sts_sets="[stsb]", model=tiny_bert,
                      tracking=", log_model: none")  # the registry is test_publish.py's
    runs = tmp_path / "results" / "resumable" / "runs"
    summary, _ = interrupt_and_resume(ray_cluster, path, runs, expected=4, trial_per_record=True)
    records = [record(p) for p in runs.glob("search-*.json")]
    # 2 configurations x 2 seeds, each run exactly once
    assert len(records) == 4 and len({r["trial_id"] for r in records}) == 4
    assert all((Path(r["best_model_dir"]).parent / "checkpoint" / "state.pt").is_file() for r in records)  # kept
    by_config: dict = {}
    for r in records:
        by_config.setdefault(r["config_id"], []).append(r["seed"])
    assert len(by_config) == 2 and all(sorted(v) == [1, 43] for v in by_config.values()), by_config
    assert summary["final"]["seeds"] == [1] and len(summary["best"]["configurations"]) == 2
    assert {k for k in summary["final"]["scores"] if "/" in k and k.count("/") == 1} == {"sts/stsb", "sts/avg"}
    # MLflow holds what the run files hold: one run per seed (a trial cut off by Ctrl-C continued its own
    # run), none left RUNNING, the search's parent run FINISHED after having been KILLED and resumed
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    mruns = client.search_runs([client.get_experiment_by_name("resumable").experiment_id], max_results=500)
    seed_runs = [r for r in mruns if r.data.tags.get("phase") == "search" and "seed" in r.data.tags]
    assert sorted(r.info.run_id for r in seed_runs) == sorted(r["mlflow_run_id"] for r in records)
    assert {r.info.status for r in mruns} == {"FINISHED"}
    assert [r.data.tags["error"] for r in mruns if "error" in r.data.tags] == []  # not `interrupted` once resumed
    assert [r.info.run_name for r in mruns if "mlflow.parentRunId" not in r.data.tags][0].startswith("search-")


ASHA_SEARCH = """\
  algorithm: grid
  warm_start: none
  seeds: 1
  max_concurrent_trials: 1
  scheduler: {type: asha, grace_period: 1, reduction_factor: 2}
  space:
    lr: {type: choice, values: [1.0e-9, 1.0e-4, 2.0e-4]}   # raw BERT's dev score (49.08) drops over the first
                                                           # steps at 1e-4 (48.56 at step 2): ASHA stops those
"""


def test_asha_on_the_seed_mean_resumes_and_records_every_seed(ray_cluster, tmp_path):
    """ASHA with seeds: 2: a trial is a configuration training both seeds in turns and reporting their mean;
    Ctrl-C after the first configuration, then --resume. Every (configuration, seed) is recorded once, finished
    (runs/) or stopped with its configuration (stopped/, best model kept, checkpoint gone, MLflow KILLED); what
    ASHA compared at each rung is the mean over the seeds of their best dev score so far. The trials train in
    their own process (`resources.workers: null`), one after another in one process (Tune's reuse_actors), and
    a trial ASHA stopped mid-run hands that process on: no trial fails."""
    from mlflow.tracking import MlflowClient
    from ray.tune import ExperimentAnalysis

    search = ASHA_SEARCH.replace("seeds: 1", "seeds: 2")
    path = experiment(tmp_path, "asha-seeds", search, "[1]", sts_sets="[stsb]", max_steps=8,
                      tracking=", log_model: none")  # no model logged: ~3 CPU-s less (test_publish.py logs them)
    assert load_config(path).resources.workers is None
    exp = tmp_path / "results" / "asha-seeds"
    summary, recorded = interrupt_and_resume(ray_cluster, path, exp / "runs", expected=6)
    finished = [record(p) for p in (exp / "runs").glob("search-*.json")]
    stopped = [record(p) for p in (exp / "stopped").glob("search-*.json")]
    assert stopped and len(finished) + len(stopped) == 6
    trials = {}
    for r in finished + stopped:
        trials.setdefault(r["trial_id"], []).append(r)
    assert len(trials) == 3 and all(sorted(r["seed"] for r in recs) == [1, 43] for recs in trials.values())
    assert sorted(recs[0]["hp"]["lr"] for recs in trials.values()) == pytest.approx([1.0e-9, 1.0e-4, 2.0e-4])
    for recs in trials.values():  # a configuration is finished or stopped as a whole
        assert len({"stopped" in r and r["stopped"] is not None for r in recs}) == 1
    for rec in stopped:
        assert rec["stopped"]["at_step"] == rec["final_step"] < 8
        best = Path(rec["best_model_dir"])
        assert best.parent.name == f"seed{rec['seed']}"
        assert json.loads((best / "raysent.json").read_text())["dev_spearman"] == pytest.approx(rec["best_dev_spearman"])
        assert not (best.parent / "checkpoint").exists()
    [state] = list((exp / "tune").glob("search-*"))
    tune_trials = {t.trial_id: t for t in ExperimentAnalysis(str(state)).trials}
    assert sorted(tune_trials) == sorted(trials) and all(" · seeds 1,43" in str(t) for t in tune_trials.values())
    assert {t.status for t in tune_trials.values()} == {"TERMINATED"}, \
        [(t.status, t.error_file) for t in tune_trials.values()]
    # the trials the resumed search ran, a stopped one among them, ran in one process, one after another
    from raysent.train.records import RunRecord

    resumed = [tid for tid, recs in trials.items()
               if not {RunRecord.model_validate(r).filename for r in recs} & recorded]
    assert len(resumed) >= 2 and len({tune_trials[tid].last_result["pid"] for tid in resumed}) == 1, resumed
    assert any(tid in {r["trial_id"] for r in stopped} for tid in resumed)
    for tid, recs in trials.items():
        lines = (Path(tune_trials[tid].path) / "result.json").read_text().splitlines()
        rungs = {r["step"]: r for r in map(json.loads, lines) if not r.get("finished")}
        assert rungs and max(rungs) == max(r["final_step"] for r in recs)
        for step, r in rungs.items():
            so_far = [max(p["dev_spearman"] for p in rec["dev_curve"] if p["step"] <= step) for rec in recs]
            assert r["best_dev_spearman"] == pytest.approx(np.mean(so_far), abs=1e-9)
            assert r["best_dev_spearman_std"] == pytest.approx(np.std(so_far, ddof=1), abs=1e-9)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    for rec in finished + stopped:
        run = client.get_run(rec["mlflow_run_id"])
        assert run.info.status == ("KILLED" if rec.get("stopped") else "FINISHED")
        assert run.data.tags.get("stopped_by") == ("scheduler" if rec.get("stopped") else None)
        assert run.info.run_name.endswith(f"· seed {rec['seed']}")
        assert [m.step for m in client.get_metric_history(run.info.run_id, "dev_spearman")] == \
            [p["step"] for p in rec["dev_curve"]]
    assert sorted(s["trial_id"] for s in summary["best"]["stopped"]) == sorted(r["trial_id"] for r in stopped)
    assert summary["best"]["hp"]["lr"] == pytest.approx(1.0e-9) and summary["best"]["n"] == 2


WARM_SEARCH = """\
  algorithm: grid
  seeds: 1
  space:
    lr: {type: choice, values: [1.0e-9, 3.0e-4]}   # the file's (the paper's) lr 1e-4 is not a grid point
"""


def test_warm_start_tries_the_papers_setting_first_and_compares_the_best_with_it(ray_cluster, tmp_path):
    """search.warm_start: paper (the default): the experiment's own lr is tried first although the grid lacks
    it, and when the search picks another configuration the final phase runs the paper's too, on the same
    seeds; the summary pairs them (raysent compare's statistics) and prints both rows."""
    from raysent.report.compare import compare
    from raysent.report.summary import format_summary
    from raysent.tune.driver import tune_experiment
    from raysent.tune.space import config_id

    # two test sets, the two smallest (STS-B 1,379 pairs, STS16 1,186; SICK-R's 4,927 cost ~8 s per final run)
    cfg = load_config(experiment(tmp_path, "warm", WARM_SEARCH, "[1, 2]", sts_sets="[stsb, sts16]"))
    typed = tune_experiment(cfg, quiet=True)
    summary = typed.model_dump(mode="json")
    exp = tmp_path / "results" / "warm"
    search = sorted(record(p)["hp"]["lr"] for p in (exp / "runs").glob("search-*.json"))
    assert search == pytest.approx([1.0e-9, 1.0e-4, 3.0e-4])  # the grid, and the paper's point
    paper_cid = config_id({"lr": 1.0e-4})
    best_cid = summary["best"]["config_id"]
    finals = {(r["config_id"], r["seed"]) for r in (record(p) for p in (exp / "runs").glob("final-*"))}
    # lr 1e-4 lowers raw BERT's SICK-R dev over the first steps (ASHA_SEARCH above); 1e-9 keeps it: 1e-9 wins
    assert best_cid == config_id({"lr": 1.0e-9}) != paper_cid
    assert finals == {(best_cid, 1), (best_cid, 2), (paper_cid, 1), (paper_cid, 2)}
    from ray.tune import ExperimentAnalysis

    [final_run] = (exp / "tune").glob("final-*")  # both arms in one Tune run: a trial per (arm, seed)
    assert final_run.name == f"final-{summary['search']}"
    assert sorted((t.config.get("arm"), t.config["seed"]) for t in ExperimentAnalysis(str(final_run)).trials) == \
        [("", 1), ("", 2), ("paper", 1), ("paper", 2)]
    vs = summary["vs_paper"]
    assert (vs["paper"], vs["searched"]) == (paper_cid, best_cid)
    runs = exp / "runs"
    again = compare([str(runs / f"final-*-{paper_cid}-seed*.json"), str(runs / f"final-*-{best_cid}-seed*.json")],
                    exp.parent).comparisons[0].tasks
    assert vs["tasks"]["stsb"]["diff_mean"] == pytest.approx(again["stsb"].diff_mean)
    assert summary["paper"]["scores"]["sts/stsb"]["n"] == 2
    text = format_summary(typed)
    # the file's lr 1e-4 is not SimCSE's 3e-5: that arm is named for where its value comes from, the file
    assert summary["warm_source"] == "file"
    assert "  searched " in text and "  file " in text and "  paper " not in text and "  Δ " in text

    # the outcome where researchers work: the search's parent run carries the table, plots and best.yaml, the
    # outcome as metrics (winner, paper arm, their paired Δ and p, best dev) and the winner's hyperparameters
    # as params; the configuration runs are named like their seeds
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("warm").experiment_id
    parent = client.get_run(json.loads((exp / "state.json").read_text())["parent_run_id"])
    # resources.gpus_per_worker auto, resolved once on this Ray without GPUs: 0, in the summary and the state, the
    # config of every run's record and the search's MLflow run; its trials trained on the CPU
    assert summary["resources"]["gpus_per_worker"] == 0.0 and summary["resources"]["auto"]
    assert summary["resources"]["device"].startswith("the CPU") and summary["resources"]["where"] == "the Ray cluster"
    assert json.loads((exp / "state.json").read_text())["resources"] == summary["resources"]
    assert {record(p)["config"]["resources"]["gpus_per_worker"] for p in (exp / "runs").glob("*.json")} == {0.0}
    assert parent.data.tags["gpus_per_worker"] == "0"
    assert summary["mlflow_runs_url"] == f"http://127.0.0.1:5000/#/experiments/{exp_id}/runs" and \
        summary["mlflow_runs_url"] in text
    files = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"summary.md", "summary.csv", "summary.json", "best.yaml", "plots"} <= files
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "plots")} >= {"plots/dev_curves.png"}
    m = parent.data.metrics
    for key in ("sts/stsb", "sts/sts16"):
        assert m[f"{key}_mean"] == pytest.approx(summary["final"]["scores"][key]["mean"])
        assert m[f"{key}_std"] == pytest.approx(summary["final"]["scores"][key]["std"])
        assert m[f"file/{key}_mean"] == pytest.approx(summary["paper"]["scores"][key]["mean"])
        d = vs["tasks"][key.split("/")[1]]
        assert m[f"delta/{key}"] == pytest.approx(d["diff_mean"]) and m[f"p_ttest/{key}"] == pytest.approx(d["t_p"])
        assert m[f"p_wilcoxon/{key}"] == pytest.approx(d["wilcoxon_p"])
    assert m["best_dev_spearman_mean"] == pytest.approx(summary["best"]["dev_mean"])
    assert parent.data.params["lr"] == "1e-09" and json.loads(parent.data.params["seeds"]) == [1, 2]
    assert "| Row |" in parent.data.tags["mlflow.note.content"]  # the run's description: the table
    names = {r.info.run_name for r in client.search_runs([exp_id], max_results=100)}
    assert {"search: lr=1e-09", "search: lr=0.0003", "final: lr=1e-09", "final: lr=0.0001"} <= names
    table = (exp / "summary.md").read_text()
    assert "— searched best" in table and "— the file's setting" in table and "[paper] SimCSE" in table

    # the final best model (best dev of the winner's final runs) is logged with the sentence_transformers
    # flavour and registered as version 1 of "warm", described by the table and tagged with the outcome
    published = summary["published"]
    finals_best = max((record(p) for p in (exp / "runs").glob(f"final-*-{best_cid}-seed*.json")),
                      key=lambda r: (r["best_dev_spearman"], -r["seed"]))  # a tie goes to the first seed
    assert published["model"]["seed"] == finals_best["seed"] and published["registered"]["version"] == "1"
    version = client.get_model_version("warm", "1")
    assert version.run_id == finals_best["mlflow_run_id"] and "| Row |" in version.description
    assert version.tags["method"] == "simcse-unsup" and json.loads(version.tags["seeds"]) == [1, 2]
    assert float(version.tags["sts/avg_mean"]) == pytest.approx(summary["final"]["scores"]["sts/avg"]["mean"],
                                                                abs=1e-4)
    assert version.tags["transductive"] == "true"
    card = (Path(finals_best["best_model_dir"]) / "README.md").read_text()
    assert "arXiv:2104.08821" in card and "Transductive**: yes" in card and "— searched best" in card

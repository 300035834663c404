"""Checks before any training: `raysent train`/`tune` (and --dry-run) find a missing model, weights, data, a
batch larger than the data, missing resources and an unwritable results folder, each named, exit 2, before
Ray starts; a search whose first trials all fail the same way stops with that one error."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from raysent.errors import ModelError
from raysent.models.encoder import Encoder, check_model
from raysent.preflight import PreflightError, batch_sizes, preflight

from conftest import RAW_BERT, SHARED, cli_in_process, run_cli

QUICK = "search_spaces/quick.yaml"


@pytest.mark.shared
def test_tune_dry_run_reports_every_problem_at_once_and_exits_2(tmp_path):
    results = tmp_path / "results"
    # in a process of its own: in the test's process, with the session's Ray up, the resources are that Ray's
    proc = run_cli("tune", QUICK, "--dry-run", "--set", "model.name=no-such-model",
                   "--set", "data.max_train_samples=20", "--set", "resources.gpus_per_worker=1",
                   "--set", f"tracking.results_dir={results}", check=False)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr
    assert "Traceback" not in err and err.count("\n  - ") == 3, err
    assert "model 'no-such-model' not found" in err and "--set model.name=PATH" in err and "--model" not in \
        err.replace("`raysent eval --model PATH`", "")
    assert "'stsb-unlabeled': 20 training example(s), fewer than the batch size 32" in err
    assert "GPU 1 (resources.gpus_per_worker), this machine has 0" in err
    assert not results.exists()  # nothing written


@pytest.mark.slow  # CLI subprocesses (~15 s)
@pytest.mark.shared
def test_dry_runs_print_row_counts_and_an_estimate(tmp_path):
    proc = cli_in_process("tune", QUICK, "--dry-run", "--format", "json", "--set", f"tracking.results_dir={tmp_path}")
    plan = json.loads(proc.stdout)
    assert plan["checked"]["data"] == {"stsb-unlabeled": "17256 (4000 used: data.max_train_samples)",
                                       "stsb:dev": 1500, "sts12": 3108, "sts13": 1500, "sts14": 3750, "sts15": 3000,
                                       "sts16": 1186, "stsb": 1379, "sickr": 4927}
    assert plan["checked"][f"model {RAW_BERT}"]["layers"] == 4
    # 6 search trials + 2 final runs of 60 steps
    assert plan["estimate"]["runs"] == 8 and plan["estimate"]["optimizer steps per run"] == 60
    proc = cli_in_process("train", QUICK, "--dry-run", "--format", "json", "--set",
                          f"train.output_dir={tmp_path / 'run'}")
    checked = json.loads(proc.stdout)["checked"]
    assert checked["output"] == str(tmp_path / "run") and not (tmp_path / "run").exists()


@pytest.mark.shared
def test_a_model_folder_without_weights_is_named_as_such(tmp_path):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    for f in (SHARED / "models" / RAW_BERT).iterdir():
        if f.is_file() and f.suffix in (".json", ".txt"):
            shutil.copy(f, folder)
    for attempt in (check_model, Encoder.load):
        with pytest.raises(ModelError, match=r"has a config.json but no weights \(model.safetensors or "
                                             r"pytorch_model.bin\)") as exc:
            attempt(str(folder))
        assert "hub" not in str(exc.value)
    with pytest.raises(ModelError, match=r"model folder .*/gone does not exist"):
        check_model(str(tmp_path / "gone"))


def _small_config(tmp_path, **over):
    """A run preflight checks quickly: one training set, STS-B as the only test set."""
    from raysent.config import parse_config

    raw = {"name": "p", "method": "simcse-unsup", "model": {"name": RAW_BERT},
           "data": {"train": "stsb:dev", "max_train_samples": 100}, "train": {"batch_size": 16},
           "eval": {"sts_sets": ["stsb"]}, "tracking": {"results_dir": str(tmp_path / "results")}}
    for key, value in over.items():
        raw[key] = {**raw.get(key, {}), **value}
    return parse_config(raw)


@pytest.mark.shared
def test_a_truncated_model_is_refused_by_preflight_and_raysent_eval_naming_the_file(tmp_path):
    """Issue 60: a model.safetensors cut short passed every check; each trial then died with a 60-line traceback
    that never named the file, and `raysent eval` on it was a raw traceback."""
    folder = tmp_path / RAW_BERT
    shutil.copytree(SHARED / "models" / RAW_BERT, folder)
    weights = folder / "model.safetensors"
    weights.chmod(0o644)
    whole = weights.stat().st_size
    os.truncate(weights, 4 * 1024 * 1024)
    want = (f"the weights file {weights} is truncated or damaged: its header describes {whole:,} bytes, the file "
            f"has {4 * 1024 * 1024:,}")
    with pytest.raises(PreflightError) as err:
        preflight(_small_config(tmp_path, model={"name": str(folder)}), resources=False)
    assert want in str(err.value) and "copy it again" in str(err.value)
    with pytest.raises(ModelError, match="truncated or damaged"):  # loading it: the same error, before the weights
        Encoder.load(str(folder))
    proc = cli_in_process("eval", "--model", str(folder), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"raysent: error: {want}"), proc.stderr


def _sqlite_store(path):
    """A sqlite file laid out as a store with some tables and rows (MLflow's names), of a few hundred KB."""
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT UNIQUE)")
    con.execute("CREATE TABLE runs (run_uuid TEXT PRIMARY KEY, experiment_id INTEGER, status TEXT)")
    con.execute("CREATE TABLE metrics (key TEXT, value REAL, step INTEGER, run_uuid TEXT, "
                "PRIMARY KEY (key, step, run_uuid))")
    con.execute("INSERT INTO experiments VALUES (0, 'Default')")
    con.executemany("INSERT INTO runs VALUES (?, 0, 'FINISHED')", [(f"run{i:04d}",) for i in range(100)])
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?)",
                    [(f"dev/stsb:dev{k}", 0.5 + s / 1000, s, f"run{r:04d}") for r in range(100) for s in range(20)
                     for k in range(3)])
    con.commit()
    con.close()


def test_a_damaged_sqlite_mlflow_store_is_refused_naming_it(tmp_path):
    """Issue 60: an mlflow.db cut short to 4 KB gave SQLAlchemy's traceback "database disk image is malformed" in
    every trial; preflight checked only that the file could be written."""
    import time

    from raysent.preflight import check_mlflow_store, check_sqlite_store

    cfg = _small_config(tmp_path)
    store = tmp_path / "results" / "mlflow.db"
    assert check_mlflow_store(cfg).endswith("mlflow.db")  # none yet: MLflow makes it
    store.parent.mkdir()
    _sqlite_store(store)
    assert store.stat().st_size > 50 * 4096
    started = time.perf_counter()
    assert check_sqlite_store(store, "tracking.results_dir") == "ok"
    assert time.perf_counter() - started < 1.0
    os.truncate(store, 4096)
    with pytest.raises(PreflightError) as err:
        check_mlflow_store(cfg)
    said = str(err.value)
    assert said.startswith(f"tracking.results_dir: the MLflow store {store} is damaged (sqlite: database disk image "
                           "is malformed)"), said
    assert f"mv {store} {store}.damaged" in said and f"{tmp_path / 'results'}/<experiment>/runs/*.json" in said
    store.write_bytes(b"not a database, " * 512)  # another file in its place
    with pytest.raises(PreflightError, match=r"is damaged \(sqlite: file is not a database\)"):
        check_mlflow_store(cfg)


@pytest.mark.shared
def test_a_damaged_mlflow_store_is_one_line_of_preflight(tmp_path):
    cfg = _small_config(tmp_path)
    store = tmp_path / "results" / "mlflow.db"
    store.parent.mkdir()
    _sqlite_store(store)
    os.truncate(store, 4096)
    with pytest.raises(PreflightError, match=f"checked before any training: tracking.results_dir: the MLflow store "
                                             f"{store} is damaged"):
        preflight(cfg, resources=False, mlflow=True)
    preflight(cfg, resources=False)  # `raysent train` logs to no store: not its problem


@pytest.mark.shared
def test_dev_and_test_sets_whose_gold_scores_are_all_equal_are_refused_naming_the_file(tmp_path, monkeypatch):
    """Issue 60: constant gold scores make Spearman NaN, so no checkpoint was ever best ("dev -inf") and the final
    phase failed on a missing best/ folder. A dev set (a user's file) and a local STS-B test copy whose scores are all
    equal are refused before any trial, each naming its file; search data read by label is not."""
    rows = (SHARED / "data" / "sts" / "STSB" / "test.tsv").read_text(encoding="utf-8").splitlines()
    flat = [rows[0]] + ["3.0\t" + r.split("\t", 1)[1] for r in rows[1:]]
    dev = tmp_path / "dev.tsv"
    dev.write_text("\n".join(flat[:60]) + "\n", encoding="utf-8")
    data = tmp_path / "data"
    (data / "sts" / "STSB").mkdir(parents=True)
    for split in ("train", "dev"):
        (data / "sts" / "STSB" / f"{split}.tsv").symlink_to(SHARED / "data" / "sts" / "STSB" / f"{split}.tsv")
    test = data / "sts" / "STSB" / "test.tsv"
    test.write_text("\n".join(flat) + "\n", encoding="utf-8")
    monkeypatch.setenv("RAYSENT_DATA_DIR", str(data))
    cfg = _small_config(tmp_path, data={"dev": [f"path:{dev}"]})
    with pytest.raises(PreflightError) as err:
        preflight(cfg, resources=False)
    said = str(err.value)
    assert f"data.dev: {dev}: every gold score is 3 (59 pair(s))" in said and "a dev set" in said, said
    assert f"eval.sts_sets (the final phase's test sets): {test}: every gold score is 3 (1,379 pair(s))" in said
    assert "NaN" in said and said.startswith("checked before any training: data.dev: ")
    # pairs read by their score (search's relevant pairs) may all be scored alike
    searched = _small_config(tmp_path, data={"dev": ["stsb:dev"]},
                             eval={"tasks": ["search"], "search_data": f"path:{dev}"})
    assert preflight(searched, resources=False)["data"][f"path:{dev}"] == 59


@pytest.mark.slow  # CLI subprocesses (~15 s)
@pytest.mark.shared
def test_unwritable_results_and_an_unstarted_resume_leave_nothing_behind(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for command in ("train", "tune"):
        proc = run_cli(command, QUICK, "--set", f"tracking.results_dir={blocker / 'results'}", check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"tracking.results_dir: got '{blocker / 'results'}': cannot be a folder: {blocker} is a file" \
            in proc.stderr
    proc = run_cli("tune", QUICK, "--resume", "--set", f"tracking.results_dir={tmp_path / 'r'}", check=False)
    assert proc.returncode == 2 and "no search to resume" in proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.shared
@pytest.mark.shared
def test_a_max_length_beyond_the_models_positions_is_refused_with_the_limit(tmp_path):
    """`train.max_length: 100000` on a model of 512 positions ran without a word (issue 47): it is refused before
    any training, naming the file, the field, the model and the limit; so is a searched value."""
    from raysent.config import parse_config

    raw = {"name": "p", "method": "simcse-unsup", "model": {"name": RAW_BERT},
           "data": {"train": "stsb:dev", "max_train_samples": 100}, "train": {"batch_size": 16, "max_length": 100000},
           "tracking": {"results_dir": str(tmp_path)},
           "search": {"space": {"max_length": {"type": "choice", "values": [128, 1024]}}}}
    with pytest.raises(PreflightError) as err:
        preflight(parse_config(raw))
    said = str(err.value)
    assert "train.max_length: got 100000: more than the 512 token positions" in said and "allowed: 2..512" in said
    assert "search.space.max_length: got 1024" in said
    raw["train"]["max_length"] = 512
    raw["search"]["space"]["max_length"]["values"] = [128, 512]
    preflight(parse_config(raw))  # at the limit: fine


def test_preflight_takes_the_largest_searched_batch_and_every_stage(tmp_path):
    from raysent.config import parse_config

    raw = {"name": "p", "method": "simcse-unsup", "model": {"name": RAW_BERT},
           "data": {"train": "stsb:dev", "max_train_samples": 100}, "train": {"batch_size": 16},
           "tracking": {"results_dir": str(tmp_path)},
           "search": {"space": {"batch_size": {"type": "choice", "values": [32, 128]}}}}
    cfg = parse_config(raw)
    assert batch_sizes(cfg) == [16, 32, 128]
    with pytest.raises(PreflightError, match="100 training example.*fewer than the batch size 128"):
        preflight(cfg)
    # ConSERT sup-unsup: the NLI stage's data is read too
    cfg = parse_config({"name": "c", "method": "consert", "model": {"name": RAW_BERT},
                        "data": {"train": "stsb-unlabeled", "sup": "path:/nowhere/nli.jsonl"},
                        "params": {"supervision": "sup-unsup"}, "tracking": {"results_dir": str(tmp_path)}})
    with pytest.raises(PreflightError, match="/nowhere/nli.jsonl"):
        preflight(cfg)


@pytest.mark.shared
def test_a_test_set_the_final_phase_cannot_read_stops_the_run_before_any_trial(tmp_path, monkeypatch):
    """SICK-R's test split is missing locally and, offline, not in the Hugging Face cache: preflight names it and the
    field that asked for it, before any trial trains (it used to fail after the whole search)."""
    from raysent.config import parse_config

    data = tmp_path / "data"
    for part in ("sts/STSB", "sts/SICK-R"):
        (data / part).mkdir(parents=True)
        for f in (SHARED / "data" / part).glob("*.tsv"):
            if f.name != "test.tsv" or part == "sts/STSB":
                (data / part / f.name).symlink_to(f)
    for year in ("STS12", "STS13", "STS14", "STS15", "STS16"):
        (data / "sts" / year).symlink_to(SHARED / "data" / "sts" / year)
    monkeypatch.setenv("RAYSENT_DATA_DIR", str(data))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    cfg = parse_config({"name": "p", "method": "simcse-unsup", "model": {"name": RAW_BERT},
                        "data": {"train": "stsb:dev"}, "tracking": {"results_dir": str(tmp_path / "r")}})
    with pytest.raises(PreflightError) as err:
        preflight(cfg, resources=False)
    msg = str(err.value)
    assert "eval.sts_sets (the final phase's test sets): sickr:test" in msg and "hf download" in msg
    assert msg.count("eval.sts_sets") == 1  # the other six test sets are there
    cfg = parse_config({"name": "p", "method": "simcse-unsup", "model": {"name": RAW_BERT},
                        "data": {"train": "stsb:dev"}, "eval": {"sts_sets": ["stsb", "sts12"]},
                        "tracking": {"results_dir": str(tmp_path / "r")}})
    assert set(preflight(cfg, resources=False)["data"]) == {"stsb:dev", "stsb", "sts12"}


class _Trial:
    def __init__(self, error):
        self.error = error

    def get_pickled_error(self):
        return self.error

    def get_error(self):
        return None


class _Wrapped(Exception):
    """Ray's wrapper of a trial's exception (RayTaskError keeps the original as ``cause``)."""

    def __init__(self, cause):
        super().__init__(f"Traceback ...\n{type(cause).__name__}: {cause}")
        self.cause = cause


@pytest.mark.slow  # a Tune callback: imports ray.tune
def test_fail_fast_stops_only_when_the_first_n_trials_fail_the_same_way():
    from raysent.tune.failfast import FailFast, describe

    ff = FailFast(3)
    for _ in range(2):
        ff.on_trial_error(0, [], _Trial(_Wrapped(ModelError("model 'x' not found"))))
    assert not ff.stop_all()
    ff.on_trial_error(0, [], _Trial(_Wrapped(ModelError("model 'x' not found"))))
    assert ff.stop_all() and ff.reason == ("ModelError", "model 'x' not found")
    # a finished trial among the first three: the search goes on, whatever fails later
    ff = FailFast(3)
    ff.on_trial_error(0, [], _Trial(_Wrapped(ValueError("a"))))
    ff.on_trial_complete(0, [], _Trial(None))
    for _ in range(5):
        ff.on_trial_error(0, [], _Trial(_Wrapped(ValueError("a"))))
    assert not ff.stop_all()
    # different error types: no single cause to report
    ff = FailFast(2)
    ff.on_trial_error(0, [], _Trial(ValueError("a")))
    ff.on_trial_error(0, [], _Trial(KeyError("b")))
    assert not ff.stop_all()
    assert not FailFast(0).stop_all() and describe(None) == ("unknown", "no error recorded")


@pytest.mark.slow
@pytest.mark.shared
def test_a_search_whose_first_trials_fail_alike_stops_with_that_error(ray_cluster, tiny_bert, tmp_path):
    """Every trial fails in training (a temperature so small that cos/τ overflows: the loss is NaN at the first
    step, which no check before training can see): the search stops after search.fail_fast of them, with the
    one error; MLflow has them FAILED with their reason, and the search's own run too."""
    from mlflow.tracking import MlflowClient

    from raysent.config import parse_config
    from raysent.errors import RaysentError
    from raysent.tune.driver import tune_experiment

    cfg = parse_config({
        "name": "ff", "method": "simcse-unsup", "model": {"name": tiny_bert},
        "data": {"train": "stsb-unlabeled", "dev": "stsb:dev", "max_train_samples": 64},
        "train": {"batch_size": 16, "max_steps": 2, "eval_at_start": False},
        "resources": {"cpus_per_worker": 0.9}, "tracking": {"results_dir": str(tmp_path)},
        "search": {"algorithm": "random", "num_samples": 6, "fail_fast": 2, "max_concurrent_trials": 1,
                   "space": {"temperature": {"type": "choice", "values": [1.0e-45, 2.0e-45]}}}})
    with pytest.raises(RaysentError, match=r"its first 2 trials all failed with NonFiniteLossError: the loss became nan"):
        tune_experiment(cfg, quiet=True)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("ff").experiment_id])
    parent = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    trials = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert [r.info.status for r in parent] == ["FAILED"]
    assert 2 <= len(trials) < 6 and {r.info.status for r in trials} == {"FAILED"}
    assert all("the loss became nan" in r.data.tags["error"] for r in trials)


def unshare_works() -> bool:
    import subprocess

    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o ro tmpfs /mnt"],
                          capture_output=True).returncode == 0


def one_line_before_ray(proc) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Started a local Ray" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("raysent: error: checked before any training: "), proc.stderr
    return lines[0]


@pytest.mark.slow  # CLI subprocesses (~8 s each)
@pytest.mark.shared
def test_an_absent_ray_too_many_cpus_and_a_read_only_mlflow_store_are_one_line_before_ray(tmp_path):
    results = tmp_path / "results"
    where = ["--set", f"tracking.results_dir={results}"]
    # no Ray listens on 127.0.0.1:1: refused at once (Ray's own client waited 300 s and more)
    line = one_line_before_ray(run_cli("tune", QUICK, *where, "--address", "127.0.0.1:1", check=False, timeout=120))
    assert "resources.address '127.0.0.1:1': no Ray answers there" in line and "ray start --head" in line
    # a trial asking for more than this machine has, before Ray starts and with nothing written
    line = one_line_before_ray(run_cli("tune", QUICK, *where, "--set", "resources.cpus_per_worker=64",
                                       "--set", "resources.gpus_per_worker=4", check=False, timeout=120))
    assert "CPU 64 (resources.cpus_per_worker), this machine has" in line and "GPU 4" in line
    assert not results.exists()
    if not unshare_works():
        pytest.skip("`unshare --mount` is not allowed here: the read-only store case needs a read-only mount")
    import subprocess
    import sys

    from conftest import REPO

    ro = tmp_path / "ro"
    ro.mkdir()
    (ro / "mlflow.db").write_text("")
    cmd = (f"mount -t tmpfs -o ro tmpfs '{ro}' && exec '{sys.executable}' -m raysent.cli tune {QUICK} "
           f"--set tracking.results_dir={results} --set tracking.mlflow_uri=sqlite:///{ro}/mlflow.db")
    proc = subprocess.run(["unshare", "--mount", "sh", "-c", cmd], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    line = one_line_before_ray(proc)
    assert f"tracking.mlflow_uri: {ro} cannot be written" in line and "Read-only file system" in line
    assert not results.exists()

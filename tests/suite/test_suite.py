"""`raysent suite`: the shipped suite files plan what they say (runs, steps, estimate, downloads), bad suite
files are refused with the file and the field, and a tiny suite really runs both arms, is resumed after an
interruption without re-running a finished experiment, and writes its table and its paired comparison, which
is checked against scipy on the run files. The committed mini suite's tables are what its report code writes
from its committed run records, and its compact headline table marks the Δ of arms that learned nothing."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest
from scipy import stats

from raysent.errors import ConfigError, RaysentError
from raysent.tune.suite import EntryComparison, format_comparisons, load_suite, plan, run_suite, write_report

from conftest import REPO, cli_in_process


def _md_rows(md: str) -> list[list[str]]:
    """The cells of a markdown table's body rows (after the header and the alignment row)."""
    return [[c.strip() for c in ln.strip().strip("|").split(" | ")] for ln in md.splitlines()
            if ln.startswith("| ")][2:]


def _md_cells(md: str) -> dict[str, list[str]]:
    """{first cell: cells} of a markdown table's body rows."""
    return {r[0]: r for r in _md_rows(md)}


def test_mini_suite_report_is_its_committed_records_and_marks_what_did_not_learn(tmp_path):
    """The report code, run on a copy of the committed run records (results/mini-*), writes exactly the committed
    results/mini/ tables. headline.md (the README's table) has one row per method whose numbers are compare.md's
    and whose learned cells are summary.md's; its Δ is marked †k/n exactly where, by the run files, neither arm
    learned on k paired seeds (simcse-unsup: all 5, so its +6.31 is two untouched encoders, not a gain)."""
    committed = REPO / "results"
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(committed / "published.yaml", results)
    for d in committed.glob("mini-*"):
        shutil.copytree(d / "runs", results / d.name / "runs")
    suite = load_suite(REPO / "benchmarks" / "mini.yaml")
    report = write_report(suite, REPO / "benchmarks" / "mini.yaml", results)
    for name in ("summary.md", "compare.md", "headline.md", "table.md", "table.csv", "table.tex", "compare.json"):
        assert (results / "mini" / name).read_text() == (committed / "mini" / name).read_text(), name
    assert report["headline"] == str(results / "mini" / "headline.md")

    headline = _md_cells((committed / "mini" / "headline.md").read_text())
    compared = _md_cells((committed / "mini" / "compare.md").read_text())
    summary = {(r[0], r[1].split(" [")[0]): r[-1] for r in _md_rows((committed / "mini" / "summary.md").read_text())}
    assert [k.split(" [")[0] for k in headline] == list(compared)  # one row per method, in the suite's order
    flats = {}
    for label, row in headline.items():
        method = label.split(" [")[0]
        paper, searched, delta, p, paper_learned, searched_learned = row[1:]
        assert [paper, searched, delta.split(" †")[0], p] == [compared[method][i] for i in (1, 2, 3, 5)]
        assert paper_learned == summary[(method, "paper defaults")]
        assert searched_learned == summary[(method, "searched")]
        at0 = {arm: {json.loads(f.read_text())["seed"] for f in (committed / f"mini-{method}-{arm}" / "runs").glob(
            "final-*.json") if json.loads(f.read_text())["best_step"] == 0} for arm in ("paper", "searched")}
        both = at0["paper"] & at0["searched"]
        assert (f" †{len(both)}/5" in delta) is bool(both) and delta.count("†") == (1 if both else 0)
        flats[method] = len(both)
    assert flats["simcse-unsup"] == 5 and flats["sbert-nli"] == 3 and flats["supcon"] == 0
    assert headline["simcse-unsup"][3] == "+6.31±0.00 †5/5"
    text = (committed / "mini" / "headline.md").read_text()
    assert "for simcse-unsup that is all of Δ" in text and "not training" in text


@pytest.mark.shared
def test_mini_suite_plan():
    p = plan(REPO / "benchmarks" / "mini.yaml")
    rows = {r["experiment"]: r for r in p["experiments"]}
    methods = ["simcse-unsup", "simcse-sup", "sg", "sg-opt", "consert", "consert-joint-unsup", "layeratt",
               "supcon", "sbert-nli"]
    for m in methods:  # every method has both arms on the same budget
        paper, searched = rows[f"mini-{m}-paper"], rows[f"mini-{m}-searched"]
        assert paper["final runs"] == searched["final runs"] == 5
        assert paper["search runs"] == 0 and searched["search runs"] == 8
        assert paper["steps per run"] == searched["steps per run"] == (80 if m == "consert-joint-unsup" else 40)
        assert "lr" in searched["searched"] and "batch_size" not in searched["searched"]
    for b in ("cls", "mean", "first-last"):
        assert rows[f"mini-baseline-{b}-paper"]["steps per run"] == 0
    assert p["runs"] == 9 * 18 + 3
    assert p["downloads"] == [] and p["missing"] == []  # runs without the hub
    assert 0.5 < p["estimated wall hours"] < 3


@pytest.mark.shared
def test_paper_suite_plan_lists_downloads_and_gpu_hours():
    p = plan(REPO / "benchmarks" / "paper.yaml")
    rows = {r["experiment"]: r for r in p["experiments"]}
    # the papers' budgets: SimCSE one epoch of wiki1m at batch 64, SG-OPT one epoch of STS-B's 17,256 sentences
    assert rows["paper-simcse-unsup-paper"]["steps per run"] == math.ceil(1_000_000 / 64)
    assert rows["paper-sg-opt-paper"]["steps per run"] == math.ceil(17_256 / 16)
    assert rows["paper-sg-opt-paper"]["final runs"] == 8  # the paper's 8 seeds
    assert any(d.startswith("model bert-base-uncased") for d in p["downloads"])
    assert p["estimated GPU-hours"] > p["estimated wall hours"] > 0
    assert "data wiki1m:train" in p["local stand-ins"]  # ../shared has a sample, and the plan says so


def test_paper_suite_plan_without_local_data(monkeypatch):
    """A user with the hub and no local data: the plan lists every download and reads no data to size runs."""
    monkeypatch.delenv("RAYSENT_DATA_DIR")
    p = plan(REPO / "benchmarks" / "paper.yaml")
    assert p["local"] == []
    for needed in ("data wiki1m:train: Hugging Face hub princeton-nlp/datasets-for-simcse/wiki1m_for_simcse.txt"
                   "@e145e8bb65", "data snli:train: Hugging Face hub stanfordnlp/snli@main",
                   "data sts12:test: Hugging Face hub princeton-nlp/datasets-for-simcse/senteval.tar@e145e8bb65",
                   "data sickr:test: Hugging Face hub princeton-nlp/datasets-for-simcse/senteval.tar@e145e8bb65"):
        assert needed in p["downloads"]


def test_suite_dry_run_cli():
    proc = cli_in_process("suite", "benchmarks/mini.yaml", "--dry-run", "--only", "sg-opt", "--format", "json")
    p = json.loads(proc.stdout)
    assert [r["experiment"] for r in p["experiments"]] == ["mini-sg-opt-paper", "mini-sg-opt-searched"]


@pytest.mark.parametrize("body, field", [
    ("name: x\nexperiments: [{name: a, config: c.yaml, arms: [best]}]\n", "experiments.0.arms.0"),
    ("name: x\nexperiments: [{name: a, config: c.yaml}]\nsteps: 3\n", "steps"),
    ("name: x\nexperiments: [{name: a, config: c.yaml}, {name: a, config: d.yaml}]\n", "repeated: a"),
    # a key given twice, at any depth, as in an experiment file
    ("name: x\nexperiments: [{name: a, config: c.yaml}]\nname: y\n",
     ":3: name: the key 'name' is given twice (first on line 1)"),
    ("name: x\nexperiments:\n  - name: a\n    config: c.yaml\n    set: {train.lr: 1.0e-4, train.lr: 3.0e-4}\n",
     ":5: experiments.0.set.train.lr: the key 'train.lr' is given twice"),
])
def test_bad_suite_files_name_the_field(tmp_path, body, field):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(ConfigError) as exc:
        load_suite(path)
    assert str(path) in str(exc.value) and field in str(exc.value)


def test_an_experiment_file_given_to_suite_is_named_and_the_command_shown(capsys, monkeypatch):
    from raysent.cli import main

    monkeypatch.chdir(REPO)
    assert main(["suite", "search_spaces/quick.yaml", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raysent: error: search_spaces/quick.yaml: is an experiment file") and "Traceback" not in err
    assert "Run this experiment with: raysent tune search_spaces/quick.yaml" in err


def test_unknown_entry_and_bad_override(tmp_path):
    with pytest.raises(ConfigError, match="--only nope: not in the suite"):
        plan(REPO / "benchmarks" / "mini.yaml", only=["nope"])
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nexperiments: [{{name: a, config: {REPO / 'search_spaces/sgopt.yaml'}, "
                    "set: {temprature: 0.1}}]\n")
    with pytest.raises(ConfigError, match="experiment 'a'.*temprature.*did you mean"):
        plan(path)


SUITE = """\
name: tiny
set:
  model.name: {model}
  train.max_steps: 3
  train.eval_every: 1
  train.batch_size: 16
  train.max_length: 24
  data.max_train_samples: 128
  data.dev: [sickr:dev]
  eval.sts_sets: [stsb]
  seeds: [1, 2]
  search.num_samples: 2
  search.seeds: 1
  resources.workers: null
  resources.cpus_per_worker: 1
  tracking.results_dir: {results}
estimate: {{step_seconds: {{default: 0.1}}}}
experiments:
  - name: base
    config: {repo}/search_spaces/baseline.yaml
    set: {{params: {{pooling: mean}}, seeds: [1]}}
    arms: [paper]
  - name: simcse
    config: {repo}/search_spaces/simcse-unsup.yaml
    set: {{params: {{pooling: mean, temperature: 0.05}}, data.train: stsb-unlabeled}}
    space: {{batch_size: null, lr: {{type: choice, values: [1.0e-5, 3.0e-4]}}}}
"""


@pytest.mark.slow
@pytest.mark.shared
def test_tiny_suite_runs_resumes_and_compares(ray_cluster, tiny_bert, tmp_path):
    results = tmp_path / "results"
    path = tmp_path / "tiny.yaml"
    # the suite's plumbing (resume, arms, tables, paired tests), not what it learns: the tiny random BERT
    path.write_text(SUITE.format(model=tiny_bert, results=results, repo=REPO))

    # an interrupted suite: only the first experiment finished
    run_suite(path, only=["base"], say=lambda m: None)
    with pytest.raises(RaysentError, match="--resume"):
        run_suite(path, say=lambda m: None)
    said: list[str] = []
    report = run_suite(path, resume=True, say=said.append)
    assert any("tiny-base-paper: finished before, kept" in s for s in said)
    assert len(list((results / "tiny-base-paper" / "runs").glob("*.json"))) == 1  # not run twice
    assert report["experiments"] == ["tiny-base-paper", "tiny-simcse-paper", "tiny-simcse-searched"]

    # both arms ran on the same seeds; the searched arm's final configuration is one of its searched ones
    recs = {arm: {r["seed"]: r for r in map(json.loads, (p.read_text() for p in
                                                         (results / f"tiny-simcse-{arm}" / "runs").glob("final-*")))}
            for arm in ("paper", "searched")}
    assert set(recs["paper"]) == set(recs["searched"]) == {1, 2}
    assert recs["searched"][1]["hp"]["lr"] in (1.0e-5, 3.0e-4) and recs["paper"][1]["hp"] == {}
    assert recs["paper"][1]["hyperparameters"]["lr"] == 3.0e-5  # the paper's lr (SimCSE)
    assert len(list((results / "tiny-simcse-searched" / "runs").glob("search-*"))) == 2
    for arm in recs.values():
        for r in arm.values():
            assert r["learned"] is (r["best_step"] > 0)

    # the table has a row per arm; the comparison equals scipy's paired tests on the runs' STS-B scores
    table = (results / "tiny" / "table.md").read_text()
    for name in report["experiments"]:
        assert f"{name}:" in table
    summary = (results / "tiny" / "summary.md").read_text().splitlines()
    assert any(ln.startswith("| base | paper defaults | 1 |") for ln in summary)
    for arm in ("paper defaults", "searched"):
        line = next(ln for ln in summary if ln.startswith(f"| simcse | {arm} [transductive] | 2 |"))
        learned = [recs["paper" if arm == "paper defaults" else "searched"][s]["learned"] for s in (1, 2)]
        assert line.endswith("| yes |" if all(learned) else "at step 0) |")
    assert (results / "tiny" / "plots" / "dev_curves.png").stat().st_size > 1000
    comp = json.loads((results / "tiny" / "compare.json").read_text())
    assert [c["experiment"] for c in comp] == ["simcse"]
    row = comp[0]["comparisons"][0]["tasks"]["stsb"]
    a = np.array([recs["paper"][s]["scores"]["sts/stsb"] for s in (1, 2)])
    b = np.array([recs["searched"][s]["scores"]["sts/stsb"] for s in (1, 2)])
    assert row["diff_mean"] == pytest.approx(float(np.mean(b - a)))
    if np.any(b != a):
        assert row["t_p"] == pytest.approx(stats.ttest_rel(b, a).pvalue)
    entries = [EntryComparison.from_json(c) for c in comp]  # compare.json read back as the typed comparisons
    assert [e.to_json() for e in entries] == comp
    line = [ln for ln in format_comparisons(entries, task="stsb").splitlines() if ln.startswith("| simcse |")]
    assert len(line) == 1 and f"{row['diff_mean']:+.2f}" in line[0]

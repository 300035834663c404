"""The shipped experiment files and the published reference numbers.

* every ``search_spaces/*.yaml`` loads and validates with its search part checked (each searched
  value must itself give a valid config), and its ``when`` conditions name a value that can occur;
* every registered method has a search-space file whose ``method`` is that method;
* ``results/published.yaml`` parses, every entry has the required fields, every score is a float
  in [0, 100], and a printed ``avg`` is the mean of its scores within 0.02, unless the entry is
  flagged ``avg_as_printed`` (the paper's own average disagrees; the flag must then be needed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raysent.config import load_config, parse_config
from raysent.methods import METHODS, get_method

from conftest import REPO

SPACES = REPO / "search_spaces"
PUBLISHED = REPO / "results" / "published.yaml"
SPACE_FILES = sorted(SPACES.glob("*.yaml"))

SEVEN = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")
SCORE_KEYS = set(SEVEN) | {"avg"}
AGGREGATIONS = {"all", "mean", "wmean", "unstated"}
SG_SEEDS = [1, 2, 3, 4, 1234, 2345, 3456, 7890]  # Kim et al. 2021, Table 8


# --------------------------------------------------------------------------- search spaces
def _load_checked(path: Path):
    """Validate through parse_config with check_search=True, as load_config does."""
    text = path.read_text(encoding="utf-8")
    return parse_config(yaml.safe_load(text), source=str(path), root=yaml.compose(text), check_search=True)


def test_there_are_search_space_files():
    assert SPACE_FILES, f"no YAML files in {SPACES}"


@pytest.mark.parametrize("path", SPACE_FILES, ids=lambda p: p.name)
def test_search_space_validates(path):
    cfg = _load_checked(path)
    assert cfg.method in METHODS
    assert load_config(path).to_dict() == cfg.to_dict()  # the public loader agrees
    if path.name == "quick.yaml":  # the CPU smoke run: no search
        return
    text = path.read_text(encoding="utf-8")
    assert text.startswith("#"), f"{path.name}: the header comment naming the paper is missing"
    assert cfg.search is not None and cfg.search.space, f"{path.name}: no search part"
    assert cfg.seeds, f"{path.name}: no seeds"


@pytest.mark.parametrize("path", [p for p in SPACE_FILES if p.name != "quick.yaml"], ids=lambda p: p.name)
def test_when_conditions_can_hold(path):
    """A ``when`` value must be one of the referenced choice's values, or inside one of them."""
    cfg = load_config(path)
    for name, entry in cfg.search.space.items():
        for ref, want in (entry.when or {}).items():
            values = cfg.search.space[ref].values
            hits = [v for v in values if v == want or (isinstance(v, (list, tuple)) and want in v)]
            assert hits, f"{path.name}: space.{name}.when {ref}={want!r} matches none of {values}"


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_has_a_search_space(method):
    owners = [p.name for p in SPACE_FILES if yaml.safe_load(p.read_text(encoding="utf-8")).get("method") == method
              and p.name != "quick.yaml"]
    assert owners, f"no search_spaces/*.yaml has method: {method}"


@pytest.mark.parametrize("name, method, extra", [
    ("sgopt.yaml", "sg-opt", {"loss": "opt3"}),
    ("sg.yaml", "sg", {"loss": "base"}),
    ("consert.yaml", "consert", {"supervision": "unsup"}),
    ("consert-joint.yaml", "consert", {"supervision": "joint"}),
    ("consert-sup-unsup.yaml", "consert", {"supervision": "sup-unsup"}),
    ("consert-joint-unsup.yaml", "consert", {"supervision": "joint-unsup"}),
    ("simcse-unsup.yaml", "simcse-unsup", {}),
    ("simcse-sup.yaml", "simcse-sup", {}),
    ("layeratt.yaml", "layeratt", {}),
    ("supcon.yaml", "supcon", {}),
    ("sbert-nli.yaml", "sbert-nli", {}),
    ("baseline.yaml", "baseline", {}),
])
def test_named_files(name, method, extra):
    cfg = load_config(SPACES / name)
    assert cfg.method == method
    for key, value in extra.items():
        assert cfg.params[key] == value
    if method in ("sg", "sg-opt"):
        assert cfg.seeds == SG_SEEDS
    elif method != "baseline":  # the untrained baseline is deterministic: one seed
        assert len(cfg.seeds) >= 5


# --------------------------------------------------------------------------- published numbers
@pytest.fixture(scope="module")
def published():
    data = yaml.safe_load(PUBLISHED.read_text(encoding="utf-8"))
    assert isinstance(data, dict) and isinstance(data.get("entries"), list) and data["entries"]
    return data


def _label(e: dict) -> str:
    return f"{e.get('paper', {}).get('short')} {e.get('table')} {e.get('block', '')} {e.get('row')!r}"


def test_papers(published):
    for key, paper in published["papers"].items():
        for field in ("short", "authors", "year", "title", "file", "eval_note"):
            assert paper.get(field), f"papers.{key}: {field} missing"
        assert isinstance(paper["year"], int)


def test_entries_have_required_fields(published):
    for e in published["entries"]:
        for field in ("paper", "table", "row", "method", "model", "eval", "scores"):
            assert field in e, f"{_label(e)}: {field} missing"
        assert {"short", "authors", "year"} <= set(e["paper"]), _label(e)
        assert e["method"] is None or e["method"] in METHODS, f"{_label(e)}: unknown method {e['method']!r}"
        if e["method"] is None:
            assert e.get("method_label"), f"{_label(e)}: no raysent method, so method_label is needed"
        ev = e["eval"]
        assert ev.get("aggregation") in AGGREGATIONS, _label(e)
        assert ev.get("correlation") in ("spearman", "pearson"), _label(e)
        assert isinstance(ev.get("transductive"), bool), _label(e)


def test_entry_params_are_method_params(published):
    for e in published["entries"]:
        if e["method"] is not None and e.get("params"):
            get_method(e["method"]).Params(**e["params"])  # raises on an unknown or invalid param


def test_scores_are_floats_in_range(published):
    for e in published["entries"]:
        scores = e["scores"]
        assert scores and set(scores) <= SCORE_KEYS, f"{_label(e)}: keys {sorted(scores)}"
        for key, value in scores.items():
            assert isinstance(value, float) and 0.0 <= value <= 100.0, f"{_label(e)}: {key}={value!r}"
        std = e.get("std") or {}
        assert set(std) <= set(scores), f"{_label(e)}: std for a task without a score"
        for key, value in std.items():
            assert isinstance(value, float) and 0.0 <= value <= 100.0, f"{_label(e)}: std {key}={value!r}"


def test_avg_is_mean_of_scores(published):
    checked = 0
    for e in published["entries"]:
        scores = e["scores"]
        if "avg" not in scores:
            assert not e.get("avg_as_printed"), _label(e)
            continue
        over = e.get("avg_over", list(SEVEN))
        assert set(over) <= set(SEVEN), _label(e)
        missing = [k for k in over if k not in scores]
        assert not missing, f"{_label(e)}: avg given but {missing} missing (set avg_over)"
        mean = sum(scores[k] for k in over) / len(over)
        agrees = abs(mean - scores["avg"]) <= 0.02
        if e.get("avg_as_printed"):
            assert not agrees, f"{_label(e)}: flagged avg_as_printed, but {scores['avg']} is the mean ({mean:.3f})"
        else:
            assert agrees, f"{_label(e)}: avg {scores['avg']} but the scores' mean is {mean:.3f}"
        checked += 1
    assert checked > 0


def test_entries_are_unique(published):
    seen = set()
    for e in published["entries"]:
        key = (e["paper"]["short"], e["table"], e.get("block"), e["row"], e["model"])
        assert key not in seen, f"duplicate entry {key}"
        seen.add(key)


def test_every_method_has_published_numbers(published):
    have = {e["method"] for e in published["entries"]}
    assert set(METHODS) <= have, f"methods without a published row: {sorted(set(METHODS) - have)}"
    modes = {e["params"]["supervision"] for e in published["entries"] if e["method"] == "consert"}
    assert modes == {"unsup", "joint", "sup-unsup", "joint-unsup"}


def test_headline_numbers(published):
    """Spot checks against the papers' text (Kim et al. 2021 Table 1; the SimCSE averages 76.3 / 81.6)."""
    def find(short, row, model):
        hits = [e for e in published["entries"]
                if e["paper"]["short"] == short and e["row"] == row and e["model"] == model]
        assert len(hits) == 1, (short, row, model, len(hits))
        return hits[0]

    sgopt = find("SG-BERT", "+ Contrastive (SG-OPT) CLS", "bert-base-uncased")
    assert sgopt["method"] == "sg-opt" and sgopt["scores"]["avg"] == 74.62 and sgopt["std"]["avg"] == 0.25
    assert sgopt["scores"]["stsb"] == 77.23 and sgopt["runs"] == 8
    unsup = find("SimCSE", "BERTbase(CLSLast)(Equation 7) †", "bert-base-uncased")
    sup = find("SimCSE", "BERTbase(CLSLast)(Equation 8) †", "bert-base-uncased")
    assert abs(unsup["scores"]["avg"] - 76.3) <= 0.05 and abs(sup["scores"]["avg"] - 81.6) <= 0.05


# --------------------------------------------------------------------------- the plan (--dry-run)
@pytest.mark.slow  # four CLI subprocesses (~19 s)
def test_dry_run_counts_every_trial_and_says_what_happens_to_checkpoints():
    """`raysent tune --dry-run` starts nothing and plans the trials the search will have: a grid's points ×
    seeds (Tune expands a grid lazily, so this count is also what an interrupted search is checked against)."""
    import json

    from raysent.tune.plan import SearchPlan
    from raysent.tune.space import grid

    from conftest import cli_in_process

    quick = json.loads(cli_in_process("tune", str(SPACES / "quick.yaml"), "--dry-run", "--format", "json").stdout)
    assert quick["search"]["trials"] == 3 * 2 and quick["final"]["runs"] == 2
    assert quick["search"]["first configuration (search.warm_start)"] == {"lr": 1.0e-4}  # a grid point already
    assert quick["trial checkpoints"].startswith("deleted")
    base_cfg = load_config(SPACES / "baseline.yaml")
    args = ("tune", str(SPACES / "baseline.yaml"), "--dry-run", "--format", "json",
            "--set", "search.keep_checkpoints=true", "--set", "search.seeds=2")
    # bert-base is not on this machine: the plan is printed, then the check before training fails (exit 2)
    proc = cli_in_process(*args, check=False)
    assert proc.returncode == 2 and "model 'bert-base-uncased' not found" in proc.stderr
    assert json.loads(proc.stdout)["checked"].startswith("FAILED")
    base = json.loads(cli_in_process(*args, "--set", "model.name=raw-bert-mini-mlm").stdout)
    points = SearchPlan.of(base_cfg).points or []
    assert base["search"]["trials"] == len(points) * 2 > 2
    assert len(points) in (len(grid(base_cfg.search.space)), len(grid(base_cfg.search.space)) + 1)
    assert base["trial checkpoints"] == "kept"


def test_the_search_summary_prints_the_papers_row_from_the_runs():
    """The end-of-search summary from real final runs (results/mini-supcon-searched, committed): the seven sets
    in the papers' order, then Avg, each the mean ± sample std of the runs' scores; Pearson on its own row."""
    import json
    import statistics

    from raysent.report.runs import TASKS
    from raysent.report.summary import format_summary
    from raysent.train.records import read_record
    from raysent.tune.best import arm_outcome
    from raysent.tune.state import Summary

    files = sorted((REPO / "results" / "mini-supcon-searched" / "runs").glob("final-*.json"))
    runs = [json.loads(p.read_text()) for p in files]
    assert len(runs) == 5
    summary = Summary(experiment="mini-supcon-searched", search=runs[0]["search"], results="r",
                      final=arm_outcome([read_record(p) for p in files], [1, 2, 3, 4, 5], []))
    text = format_summary(summary).splitlines()
    head = next(i for i, line in enumerate(text) if line.split()[:2] == ["STS12", "STS13"])
    assert text[head].split() == ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg"]
    expected = [f"{statistics.mean(v):.2f}±{statistics.stdev(v):.2f}"
                for v in ([r["scores"][f"sts/{t}"] for r in runs] for t in (*TASKS, "avg"))]
    assert text[head + 1].split() == ["Spearman", *expected]
    assert text[head + 2].split()[0] == "Pearson"


def test_trials_are_named_by_what_differs():
    """Tune's console table and MLflow name a trial `lr=0.0001 · seed 2`, not `run_trial_7eddca46`."""
    from types import SimpleNamespace

    from raysent.tune.trial import TrialNamer, trial_dirname

    cfg = load_config(REPO / "search_spaces" / "quick.yaml")
    grid_trial = SimpleNamespace(config={"hp": {"lr": 1.0e-4}, "seed_index": 1}, trainable_name="run_trial",
                                 trial_id="7eddca46")
    assert TrialNamer(cfg, "search")(grid_trial) == "lr=0.0001 · seed 2"
    assert trial_dirname(grid_trial) == "run_trial_7eddca46"
    assert TrialNamer(cfg, "final", {"": {"lr": 3.0e-4}})(SimpleNamespace(config={"seed": 1})) == "lr=0.0003 · seed 1"
    arms = {"": {"lr": 3.0e-4}, "paper": {"lr": 1.0e-4}}
    assert TrialNamer(cfg, "final", arms)(SimpleNamespace(config={"arm": "paper", "seed": 2})) == "lr=0.0001 · seed 2"
    assert TrialNamer(cfg, "final")(SimpleNamespace(config={"seed": 1})) == "defaults · seed 1"
    sg = load_config(REPO / "search_spaces" / "sgopt.yaml")
    repeat = {name: (e.values[0] if e.type == "choice" else e.low) for name, e in sg.search.space.items()}
    name = TrialNamer(sg, "search")(SimpleNamespace(config={**repeat, "__trial_index__": 0}))
    assert name.endswith(f"· seed {sg.seeds[0]}") and "temperature=" in name


def test_the_papers_own_settings_are_the_defaults():
    """Where raysent differed from a paper or its authors' script (issue 21): SupCon pools without [CLS]
    (Liao 2021, §3); LayerAtt's supervised objectives take the authors' script's length, epochs and cadence,
    Eq. 7 SimCSE's; SG-OPT keeps the paper's views (max, BERT_F fixed), the official code's are options."""
    def resolved(method: str, **params):
        return parse_config({"name": "x", "method": method, "model": {"name": "m"}, "params": params})

    assert resolved("supcon").params["pooling"] == "mean_no_cls"
    for objective, want in (("eq8", (64, 3, 100)), ("eq6", (64, 3, 100)), ("eq7", (32, 1, 125))):
        t = resolved("layeratt", objective=objective).train
        assert (t.max_length, t.epochs, t.eval_every) == want, objective
    sg = resolved("sg-opt").params
    assert (sg["view_pooling"], sg["frozen_dropout"]) == ("max", False)
    space = load_config(REPO / "search_spaces" / "sgopt.yaml").search.space
    assert space["view_pooling"].values == ["max", "mean"] and space["frozen_dropout"].values == [False, True]
    assert load_config(REPO / "search_spaces" / "supcon.yaml").search.space["pooling"].values == ["mean_no_cls",
                                                                                                  "mean"]


def test_a_tie_goes_to_the_configuration_that_learned_and_says_so(tmp_path):
    """Two configurations with the same mean dev score, one whose runs kept the untouched encoder (best at
    step 0): the one that learned is the best, whichever was recorded first, and the search says why."""
    from raysent.io import write_json_atomic
    from raysent.train.records import RunRecord
    from raysent.tune.best import pick_best

    cfg = load_config(REPO / "search_spaces" / "quick.yaml")
    exp = tmp_path / "quick"
    for cid, lr, best_step in (("aaaa000000", 1.0e-5, 0), ("bbbb000000", 3.0e-4, 40)):
        for seed in (1, 2):
            rec = RunRecord(experiment="quick", phase="search", search="s1", config_id=cid, hp={"lr": lr}, seed=seed,
                            method="simcse-unsup", model="m", config={}, best_dev_spearman=50.0, best_step=best_step,
                            learned=best_step > 0)
            write_json_atomic(exp / "runs" / f"search-s1-{cid}-seed{seed}.json", rec.to_json())
    said: list[str] = []
    best = pick_best(exp, "s1", cfg.search.mode, [], said.append)
    assert best.config_id == "bbbb000000" and best.tie == {"with": ["aaaa000000"], "learned": True}
    assert any("2 configurations tie at dev 50.0000: bbbb000000 is taken because it learned" in s for s in said)

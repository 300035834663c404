"""Tables, published rows, plots, paired comparisons and the layer grid (raysent.report, eval --layers).

Run files are written here with known numbers; every expectation is computed independently
(``statistics.mean``/``statistics.stdev`` for the cells, scipy run directly for the tests, a plain
transformers forward pass per sentence for the layer grid). No Ray, no training.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raysent.cli import main
from raysent.errors import RaysentError
from raysent.report.compare import compare
from raysent.report.runs import load_experiment, resolve
from raysent.report.table import build_table, escape_latex, escape_markdown

from conftest import SHARED

TASKS = ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]
LABELS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R"]


def value(cid: str, seed: int, task: str, kind: str = "spearman_all") -> float:
    """A known, irregular number for every (configuration, seed, set, aggregation)."""
    base = {"aaaa": 70.0, "bbbb": 60.0, "cccc": 65.0, "dddd": 50.0}.get(cid, 55.0)
    off = {"spearman_all": 0.0, "spearman_wmean": -2.5, "spearman_mean": -3.25, "pearson_all": 1.75,
           "pearson_wmean": 0.5, "pearson_mean": 0.25}[kind]
    wobble = ((seed * 7 + ord(cid[0]) * 3 + TASKS.index(task)) % 11) * 0.05  # differs between configurations
    return base + off + TASKS.index(task) * 1.7 + seed * 0.37 + (seed * seed % 5) * 0.113 + wobble


def write_run(root: Path, exp: str, cid: str, seed: int, hp: dict, *, phase: str = "final", seeds=(1, 2, 3),
              tasks=TASKS, details: bool = True, method: str = "simcse-unsup", model: str = "bert-base-uncased",
              dev_curve=None, search: str = "20260101-000000", search_seeds: int = 2) -> Path:
    scores, det = {}, {}
    if phase == "final":
        for t in tasks:
            scores[f"sts/{t}"] = value(cid, seed, t)
            scores[f"sts/{t}/pearson"] = value(cid, seed, t, "pearson_all")
            det[t] = {"n": 100, **{k: value(cid, seed, t, k) for k in ("spearman_all", "spearman_wmean", "spearman_mean",
                                                                        "pearson_all", "pearson_wmean", "pearson_mean")},
                      "spearman": value(cid, seed, t), "pearson": value(cid, seed, t, "pearson_all")}
        if len(tasks) == 7:
            scores["sts/avg"] = float(np.mean([value(cid, seed, t) for t in tasks]))
    curve = dev_curve or [{"step": 0, "dev_spearman": 80.0}, {"step": 10, "dev_spearman": 80.0 + seed * 0.1},
                          {"step": 20, "dev_spearman": 80.0 + seed * 0.2 + len(cid) * 0.01}]
    rec = {
        "schema_version": 1, "experiment": exp, "phase": phase, "search": search, "config_id": cid, "hp": hp, "seed": seed,
        "method": method, "model": model,
        "hyperparameters": {"method": method, "model": model, "seed": seed, "batch_size": 64, "pooling": "cls_mlp_train",
                            **hp},
        "transductive": False, "best_dev_spearman": max(p["dev_spearman"] for p in curve), "dev_curve": curve,
        "config": {"name": exp, "method": method, "model": {"name": model}, "seeds": list(seeds),
                   "train": {"seed": seed, "batch_size": 64, "lr": hp.get("lr", 3e-5)},
                   "params": {"pooling": "cls_mlp_train", **{k: v for k, v in hp.items() if k != "lr"}},
                   "search": {"seeds": search_seeds, "space": {"temperature": {"type": "loguniform", "low": 0.01,
                                                                               "high": 0.2}}},
                   "eval": {"aggregation": "all"}},
        "scores": scores,
    }
    if details and phase == "final":
        sts = {"aggregation": "all", "tasks": det, "avg": float(np.mean([d["spearman"] for d in det.values()])),
               "avg_pearson": float(np.mean([d["pearson"] for d in det.values()]))}
        rec["eval"] = {"metrics": scores, "details": {"sts": sts}}  # version 1's shape (read as version 3)
    path = root / exp / "runs" / f"{phase}-{search}-{cid}-seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


def cell(mean: float, values: list[float], expected: int | None = None) -> str:
    n = len(values)
    s = f"{mean:.2f}" + (f"±{statistics.stdev(values):.2f}" if n > 1 else "")
    return s + (f" ({n}/{expected})" if expected is not None and expected != n else f" ({n})")


@pytest.fixture()
def results(tmp_path) -> Path:
    """abl: aaaa (3 seeds, complete), bbbb (seed 3 missing, seed 2 without SICK-R)."""
    root = tmp_path / "results"
    for s in (1, 2, 3):
        write_run(root, "abl", "aaaa", s, {"temperature": 0.05, "lr": 3e-5})
    write_run(root, "abl", "bbbb", 1, {"temperature": 0.1, "lr": 3e-5})
    write_run(root, "abl", "bbbb", 2, {"temperature": 0.1, "lr": 3e-5}, tasks=TASKS[:6])
    return root


def _md_rows(md: str) -> list[list[str]]:
    """The cells of a markdown table (split on unescaped pipes)."""
    rows = []
    for line in md.splitlines():
        if line.startswith("| "):
            parts = re.split(r"(?<!\\)\|", line)[1:-1]
            rows.append([p.strip() for p in parts])
    return rows


# --------------------------------------------------------------------------- cells
def test_every_cell_mean_sample_std_and_counts(results):
    table = build_table(load_experiment("abl", results, "final"))
    df = table.frame()
    assert list(df.columns) == ["Row", "Model", *LABELS, "Avg"]  # the papers' order
    assert len(df) == 2
    a = df[df["Row"].str.contains("aaaa")].iloc[0]
    b = df[df["Row"].str.contains("bbbb")].iloc[0]
    for t, label in zip(TASKS, LABELS):
        va = [value("aaaa", s, t) for s in (1, 2, 3)]
        assert a[label] == cell(statistics.mean(va), va), label
    avg_a = [statistics.mean(value("aaaa", s, t) for t in TASKS) for s in (1, 2, 3)]
    assert a["Avg"] == cell(statistics.mean(avg_a), avg_a)
    # bbbb: seed 3 has no run file (n/3 everywhere); seed 2 has no SICK-R, hence no Avg
    for t, label in zip(TASKS[:6], LABELS[:6]):
        vb = [value("bbbb", s, t) for s in (1, 2)]
        assert b[label] == cell(statistics.mean(vb), vb, 3), label
    assert b["SICK-R"] == f"{value('bbbb', 1, 'sickr'):.2f} (1/3)"
    assert b["Avg"] == f"{statistics.mean(value('bbbb', 1, t) for t in TASKS):.2f} (1/3)"
    notes = "\n".join(table.notes)
    assert "bbbb seed 3: no run file" in notes and "final-20260101-000000-bbbb-seed3.json" in notes
    assert "bbbb seed 2: no SICK-R score in final-20260101-000000-bbbb-seed2.json" in notes

    csv_df = pd.read_csv(__import__("io").StringIO(table.to_csv()))
    rb = csv_df[csv_df["key"] == "abl/bbbb"].iloc[0]
    assert rb["sickr_n"] == 1 and rb["sickr_expected"] == 3 and np.isnan(rb["sickr_std"])
    assert rb["sts12_n"] == 2 and rb["sts12_std"] == pytest.approx(statistics.stdev(
        [value("bbbb", s, "sts12") for s in (1, 2)]), abs=1e-12)
    ra = csv_df[csv_df["key"] == "abl/aaaa"].iloc[0]
    assert ra["avg_mean"] == pytest.approx(statistics.mean(avg_a), abs=1e-12)


def test_a_dataset_no_run_has_is_a_dash_with_its_count(results):
    for s in (1, 2):
        write_run(results, "nosick", "cccc", s, {"temperature": 0.05}, seeds=(1, 2), tasks=TASKS[:6])
    df = build_table(load_experiment("nosick", results)).frame()
    assert df.iloc[0]["SICK-R"] == "— (0/2)"
    assert df.iloc[0]["Avg"] == "— (0/2)"
    v = [value("cccc", s, "stsb") for s in (1, 2)]
    assert df.iloc[0]["STS-B"] == cell(statistics.mean(v), v)


def test_aggregation_and_correlation_pick_the_stored_numbers(results):
    runs = load_experiment("abl", results)
    for agg, corr in (("wmean", "spearman"), ("all", "pearson"), ("mean", "pearson")):
        df = build_table(runs, aggregation=agg, correlation=corr).frame()
        a = df[df["Row"].str.contains("aaaa")].iloc[0]
        v = [value("aaaa", s, "sts13", f"{corr}_{agg}") for s in (1, 2, 3)]
        assert a["STS13"] == cell(statistics.mean(v), v)


def test_aggregation_a_file_lacks_is_refused_naming_file_and_what_it_has(results):
    path = write_run(results, "old", "dddd", 1, {"temperature": 0.05}, details=False, seeds=(1,))
    runs = load_experiment("old", results)
    assert build_table(runs).frame().iloc[0]["STS12"] == f"{value('dddd', 1, 'sts12'):.2f} (1)"
    with pytest.raises(RaysentError) as err:
        build_table(runs, aggregation="wmean")
    assert str(path) in str(err.value) and "only in the aggregation(s) all" in str(err.value)
    assert "--aggregation all" in str(err.value)


# --------------------------------------------------------------------------- group-by
def test_group_by_a_hyperparameter(results):
    for s in (1, 2, 3):
        write_run(results, "abl", "cccc", s, {"temperature": 0.05, "lr": 5e-5})
    table = build_table(load_experiment("abl", results), group_by=["temperature"])
    df = table.frame()
    assert list(df["Row"]) == ["simcse-unsup, temperature=0.05", "simcse-unsup, temperature=0.1"]
    v = [value(c, s, "sts14") for c in ("aaaa", "cccc") for s in (1, 2, 3)]
    assert df.iloc[0]["STS14"] == cell(statistics.mean(v), v)  # 6 runs, 6 expected
    assert df.iloc[1]["STS14"].endswith("(2/3)")
    assert any("temperature=0.05: the runs of this row differ in lr (3e-05, 5e-05)" in n for n in table.notes)
    by_dotted = build_table(load_experiment("abl", results), group_by=["params.temperature"]).frame()
    assert list(by_dotted["STS14"]) == list(df["STS14"])


def test_group_by_seed_expects_one_run_per_row(results):
    df = build_table(load_experiment("abl", results), group_by=["config_id", "seed"]).frame()
    assert len(df) == 5  # aaaa x 3 seeds, bbbb x 2 (seed 3 has no file, so no row)
    assert all(c.endswith(" (1)") for c in df["STS12"])
    assert df[df["Row"].str.contains("bbbb, seed=2")].iloc[0]["SICK-R"] == "— (0/1)"


def test_group_by_an_unknown_field_lists_the_available_ones(results):
    with pytest.raises(RaysentError) as err:
        build_table(load_experiment("abl", results), group_by=["temprature"])
    msg = str(err.value)
    assert "--group-by 'temprature'" in msg and "did you mean 'temperature'" in msg
    assert "available:" in msg and "lr" in msg and "batch_size" in msg and "train.lr" in msg


# --------------------------------------------------------------------------- escaping
def test_markdown_and_latex_escape(results):
    hp = {"temperature": 0.05, "tag": "50%_&_#1|x*[y]{z}$~^\\"}
    for s in (1, 2):
        write_run(results, "esc_exp", "eeee", s, hp, seeds=(1, 2))
    table = build_table(load_experiment("esc_exp", results))
    md = table.to_markdown()
    assert "esc\\_exp: simcse-unsup (temperature=0.05, tag=50%\\_&\\_#1\\|x\\*[y]{z}$~^\\\\)" in md
    rows = _md_rows(md)
    assert all(len(r) == 2 + 8 for r in rows), "an unescaped | split a cell"
    tex = table.to_latex()
    assert ("esc\\_exp: simcse-unsup (temperature=0.05, tag=50\\%\\_\\&\\_\\#1|x*{[}y{]}\\{z\\}\\$"
            "\\textasciitilde{}\\textasciicircum{}\\textbackslash{})") in tex
    body = [line for line in tex.splitlines() if line.endswith("\\\\")]
    for line in body:  # every row: exactly 9 column separators (& not preceded by a backslash)
        assert len(re.findall(r"(?<!\\)&", line)) == 9, line
    assert "$\\pm$" in tex and "±" not in tex
    assert escape_latex("a_b%c&d#e") == "a\\_b\\%c\\&d\\#e"
    assert escape_markdown("a_b|c*d") == "a\\_b\\|c\\*d"


# --------------------------------------------------------------------------- published
PUBLISHED = """
papers:
  p: &p {short: TestPaper, authors: "Ada Lovelace, Alan Turing", year: 2021, title: T, file: x, eval_note: n}
entries:
  - paper: *p
    table: "Table 9"
    row: "Ours-like_row & co †"
    method: simcse-unsup
    params: {pooling: cls_mlp_train}
    model: bert-base-uncased
    eval: {aggregation: all, correlation: spearman, transductive: false}
    runs: 8
    scores: {sts12: 68.40, sts13: 82.41, sts14: 74.38, sts15: 80.91, sts16: 78.56, stsb: 76.85, sickr: 72.23, avg: 76.25}
    std: {sts12: 0.73, sts13: 0.51, sts14: 0.40, sts15: 0.28, sts16: 0.22, stsb: 0.43, sickr: 0.50, avg: 0.25}
  - paper: *p
    table: "Table 9"
    row: "other model"
    method: simcse-unsup
    model: roberta-base
    eval: {aggregation: wmean, correlation: spearman, transductive: false}
    scores: {sts12: 60.0, sts13: 61.0}
"""


def test_published_rows_are_marked_with_differences_where_method_and_model_match(results, tmp_path):
    pf = tmp_path / "published.yaml"
    pf.write_text(PUBLISHED)
    table = build_table(load_experiment("abl", results), published="match", published_file=pf)
    df = table.frame()
    paper = df[df["Row"].str.startswith("[paper]")]
    assert list(paper["Row"]) == ["[paper] TestPaper Ours-like_row & co † (Lovelace 2021, Table 9)",
                                  "[paper] TestPaper other model (Lovelace 2021, Table 9)"]
    assert paper.iloc[0]["STS12"] == "68.40±0.73 (8)" and paper.iloc[0]["Avg"] == "76.25±0.25 (8)"
    assert paper.iloc[1]["STS12"] == "60.00" and paper.iloc[1]["STS14"] == "—"
    deltas = df[df["Row"].str.startswith("Δ")]
    assert list(deltas["Row"]) == ["Δ abl/aaaa − [paper] above", "Δ abl/bbbb − [paper] above"]  # roberta: no Δ
    va = [value("aaaa", s, "sts12") for s in (1, 2, 3)]
    assert deltas.iloc[0]["STS12"] == f"{statistics.mean(va) - 68.40:+.2f}"
    assert deltas.iloc[1]["SICK-R"] == f"{value('bbbb', 1, 'sickr') - 72.23:+.2f}"
    # the row order: ours, then each paper row followed by its differences
    kinds = [r.kind for r in table.rows]
    assert kinds == ["ours", "ours", "paper", "delta", "delta", "paper"]
    tex = table.to_latex()
    assert "{[}paper{]} TestPaper Ours-like\\_row \\& co \\dag{} (Lovelace 2021, Table 9)" in tex
    assert "$\\Delta$ abl/aaaa $-$ {[}paper{]} above" in tex


def test_shipped_published_file_and_paper_selection(results):
    table = build_table(load_experiment("abl", results), published="SimCSE")
    rows = [r.label for r in table.rows if r.kind == "paper"]
    assert rows and all(r.startswith("[paper] SimCSE ") for r in rows)
    assert any(r.kind == "delta" for r in table.rows)  # simcse-unsup on bert-base-uncased is in SimCSE's rows
    with pytest.raises(RaysentError, match="allowed: match .* SG-BERT"):
        build_table(load_experiment("abl", results), published="SimCSEE")


# --------------------------------------------------------------------------- CLI
def test_cli_table_prints_and_writes_md_tex_csv(results, capsys):
    assert main(["table", "abl", "--results-dir", str(results)]) == 0
    out = capsys.readouterr().out
    for ext in ("md", "tex", "csv"):
        assert (results / "abl" / f"table.{ext}").is_file()
    assert out == (results / "abl" / "table.md").read_text()
    assert main(["table", "abl", "--results-dir", str(results), "--group-by", "temperature", "--correlation",
                 "pearson"]) == 0
    assert (results / "abl" / "table-pearson-by-temperature.md").is_file()
    assert main(["table", "abl", "--results-dir", str(results), "--phase", "search"]) == 2
    err = capsys.readouterr().err
    assert "no search-phase runs" in err and "phases present: final" in err
    assert main(["table", "nope", "--results-dir", str(results)]) == 2
    assert "experiments with run files" in capsys.readouterr().err


# --------------------------------------------------------------------------- compare
def test_compare_matches_scipy_paired_tests_by_seed(tmp_path, capsys):
    root = tmp_path / "results"
    seeds = (1, 2, 3, 4, 5, 6, 7)
    for s in seeds[:6]:
        write_run(root, "cmp", "aaaa", s, {"temperature": 0.05}, seeds=seeds)
    for s in seeds:  # seed 7 only in B: left out of the pairing
        write_run(root, "cmp", "cccc", s, {"temperature": 0.1}, seeds=seeds)
    res = compare(["cmp:aaaa", "cmp:cccc"], root)
    comp = res.comparisons[0]
    assert comp.only_in_b == [7]
    for t in ("sts12", "sickr", "avg"):
        if t == "avg":
            a = [statistics.mean(value("aaaa", s, x) for x in TASKS) for s in seeds[:6]]
            b = [statistics.mean(value("cccc", s, x) for x in TASKS) for s in seeds[:6]]
        else:
            a = [value("aaaa", s, t) for s in seeds[:6]]
            b = [value("cccc", s, t) for s in seeds[:6]]
        r = comp.tasks[t]
        assert r.n == 6 and r.seeds == list(seeds[:6])
        assert r.diff_mean == pytest.approx(statistics.mean(np.subtract(b, a)), abs=1e-9)
        assert r.t_p == pytest.approx(stats.ttest_rel(b, a).pvalue, rel=1e-9)
        assert r.wilcoxon_p == pytest.approx(stats.wilcoxon(b, a).pvalue, rel=1e-9)
    assert main(["compare", "cmp:aaaa", str(root / "cmp" / "runs" / "final-*-cccc-seed*.json"), "--results-dir",
                 str(root)]) == 0
    out = capsys.readouterr().out
    assert "Δ (B−A)" in out and "t-test p" in out and "only in B [7]" in out
    # an experiment with two configurations is ambiguous: the error names how to pick one
    assert main(["compare", "cmp", "cmp:aaaa", "--results-dir", str(root)]) == 2
    err = capsys.readouterr().err
    assert "'cmp' names more than one run of seed 1" in err and "name one configuration" in err


COMMITTED = Path(__file__).resolve().parents[2] / "results"  # the mini suite's committed run records


def _seeds_at_step_0(experiment: str) -> list[int]:
    """Read straight from the run files: the seeds whose best dev checkpoint is step 0."""
    recs = [json.loads(p.read_text()) for p in (COMMITTED / experiment / "runs").glob("final-*.json")]
    return sorted(r["seed"] for r in recs if r["best_step"] == 0)


def test_compare_marks_arms_that_did_not_learn_on_the_committed_mini_records(capsys):
    """Issue 27: simcse-unsup's searched arm is +6.31 Avg over its paper arm, but neither learned (best dev
    checkpoint at step 0 on every seed): both report the untouched encoder, read with two poolings. compare
    marks each arm that did not learn and says when Δ is between untrained encoders; supcon, whose arms both
    learned, gets no mark; sbert-nli, which learned on one seed per arm, is marked seed by seed."""
    flat = {e: _seeds_at_step_0(f"mini-{e}") for e in ("simcse-unsup-paper", "simcse-unsup-searched",
                                                        "sbert-nli-paper", "sbert-nli-searched", "supcon-paper",
                                                        "supcon-searched")}
    assert flat["simcse-unsup-paper"] == flat["simcse-unsup-searched"] == [1, 2, 3, 4, 5]
    assert flat["supcon-paper"] == flat["supcon-searched"] == []

    res = compare(["mini-simcse-unsup-paper", "mini-simcse-unsup-searched"], COMMITTED)
    comp = res.comparisons[0]
    assert comp.tasks["avg"].diff_mean == pytest.approx(6.31, abs=0.005)
    for side in (res.baseline, comp.run):
        assert side.learned is False and side.not_learned_seeds == [1, 2, 3, 4, 5]
    assert comp.neither_learned is True and comp.neither_learned_seeds == [1, 2, 3, 4, 5]

    res = compare(["mini-supcon-paper", "mini-supcon-searched"], COMMITTED)
    comp = res.comparisons[0]
    for side in (res.baseline, comp.run):
        assert side.learned is True and side.not_learned_seeds == []
    assert comp.neither_learned is False and comp.neither_learned_seeds == []

    res = compare(["mini-sbert-nli-paper", "mini-sbert-nli-searched"], COMMITTED)
    comp = res.comparisons[0]
    assert res.baseline.not_learned_seeds == flat["sbert-nli-paper"] == [2, 3, 4, 5]
    assert comp.run.not_learned_seeds == flat["sbert-nli-searched"] == [1, 3, 4, 5]
    assert res.baseline.learned is False and comp.run.learned is False
    assert comp.neither_learned is False and comp.neither_learned_seeds == [3, 4, 5]

    # the printed output: both A and B lines marked, and the note that Δ is between untrained encoders
    assert main(["compare", "mini-simcse-unsup-paper", "mini-simcse-unsup-searched", "--results-dir",
                 str(COMMITTED)]) == 0
    out = capsys.readouterr().out
    a_line, b_line = (next(ln for ln in out.splitlines() if ln.startswith(x)) for x in ("A = ", "B = "))
    assert a_line.endswith("[no learning: 5/5 at step 0]") and b_line.endswith("[no learning: 5/5 at step 0]")
    assert "NEITHER A NOR B LEARNED" in out and "between two untrained encoders" in out
    assert main(["compare", "mini-sbert-nli-paper", "mini-sbert-nli-searched", "--results-dir",
                 str(COMMITTED)]) == 0
    out = capsys.readouterr().out
    assert "[no learning: 4/5 at step 0, seeds 2, 3, 4, 5]" in out
    assert "on seeds 3, 4, 5 neither A nor B learned" in out and "NEITHER A NOR B" not in out
    assert main(["compare", "mini-supcon-paper", "mini-supcon-searched", "--results-dir", str(COMMITTED)]) == 0
    out = capsys.readouterr().out
    assert "no learning" not in out and "untrained" not in out
    assert main(["compare", "mini-simcse-unsup-paper", "mini-simcse-unsup-searched", "--results-dir",
                 str(COMMITTED), "--format", "json"]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["comparisons"][0]["neither_learned"] is True and js["baseline"]["not_learned_seeds"] == [1, 2, 3, 4, 5]


def test_resolve_names(results):
    assert {r.config_id for r in resolve("aaaa", results)} == {"aaaa"}
    assert len(resolve(str(results / "abl" / "runs" / "*-bbbb-*.json"), results)) == 2
    with pytest.raises(RaysentError, match="neither an experiment"):
        resolve("zzzz", results)


# --------------------------------------------------------------------------- plots
def test_plots_are_png(results, tmp_path):
    import optuna
    from PIL import Image

    from raysent.report.plots import plot_experiment

    search = "20260101-000000"
    for cid, t, lr in (("s1", 0.02, 1e-5), ("s2", 0.05, 3e-5), ("s3", 0.1, 3e-5)):
        for seed in (1, 2):
            write_run(results, "abl", cid, seed, {"temperature": t, "lr": lr}, phase="search", search=search)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=f"search-{search}", storage=f"sqlite:///{results / 'abl' / 'optuna.db'}",
                                direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda tr: 80 + tr.suggest_float("temperature", 0.01, 0.2, log=True)
                   + tr.suggest_categorical("lr", [1e-5, 3e-5]) * 1e4, n_trials=4)
    # 4 trials: no importance plot (fANOVA on 4 points is noise), and the reason is given
    written, skipped = plot_experiment("abl", results)
    assert skipped == [f"importance: study search-{search}: 4 completed trials; hyperparameter importances need "
                       "at least 8 to mean anything (fANOVA fits a forest to them)"]
    assert "optuna_parallel_coordinate.png" in {p.name for p in written}
    study.optimize(lambda tr: 80 + tr.suggest_float("temperature", 0.01, 0.2, log=True)
                   + tr.suggest_categorical("lr", [1e-5, 3e-5]) * 1e4, n_trials=4)
    written, skipped = plot_experiment("abl", results)
    assert not skipped, skipped
    assert sorted(p.name for p in written) == ["budget.png", "dev_curves.png", "optuna_importances.png",
                                               "optuna_parallel_coordinate.png", "search_hyperparameters.png"]
    for p in written:
        assert p.parent == results / "abl" / "plots"
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(p) as im:
            im.verify()
            assert im.size[0] > 300 and im.size[1] > 200


def test_report_imports_no_ray_or_mlflow():
    import subprocess
    import sys

    code = ("import sys, raysent.report.table, raysent.report.compare, raysent.report.plots, raysent.eval.layers; "
            "print(sorted(m for m in ('ray', 'mlflow') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- eval --layers
def _independent_grid(model_dir: Path, pairs: list[tuple[str, str, float]]) -> dict:
    """Each sentence alone through transformers (no padding), pooled by hand, scipy's spearmanr."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    cache: dict[str, tuple] = {}
    with torch.no_grad():
        for s in {x for p in pairs for x in p[:2]}:
            enc = tok(s, return_tensors="pt", truncation=True, max_length=256)
            hs = model(**enc, output_hidden_states=True).hidden_states
            cache[s] = tuple(h[0].double().numpy() for h in hs)  # [T, d] per layer
    n_layers = len(next(iter(cache.values())))
    gold = np.array([p[2] for p in pairs])
    out = {}
    for pool_name, fn in (("cls", lambda h: h[0]), ("mean", lambda h: h.mean(0)), ("max", lambda h: h.max(0))):
        scores = []
        for k in range(n_layers):
            a = np.stack([fn(cache[p[0]][k]) for p in pairs])
            b = np.stack([fn(cache[p[1]][k]) for p in pairs])
            cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
            scores.append(None if np.ptp(cos) < 1e-9 else stats.spearmanr(cos, gold).statistic * 100)
        out[pool_name] = scores
    return out


@pytest.mark.shared
def test_eval_layers_against_an_independent_computation(tmp_path, capsys):
    import torch

    torch.set_num_threads(1)
    n = 80
    png = tmp_path / "layers.png"
    assert main(["eval", "--model", "paraphrase-MiniLM-L3-v2", "--layers", "--max-samples", str(n), "--threads", "1",
                 "--format", "json", "--plot", str(png)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["layers"] == [0, 1, 2, 3] and res["poolings"] == ["cls", "mean", "max"]
    assert res["n_pairs"] == {"stsb:dev": n}
    assert any("first 80 pairs" in note for note in res["notes"])
    with (SHARED / "data" / "sts" / "STSB" / "dev.tsv").open(encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t", quoting=csv.QUOTE_NONE))[:n]
    pairs = [(r["sentence1"], r["sentence2"], float(r["score"])) for r in rows]
    ref = _independent_grid(SHARED / "models" / "paraphrase-MiniLM-L3-v2", pairs)
    for p in ("cls", "mean", "max"):
        for k in range(4):
            ours, theirs = res["grid"][p][k], ref[p][k]
            if theirs is None:  # layer 0 [CLS]: the same vector for every sentence
                assert ours is None, (p, k)
            else:
                assert ours == pytest.approx(theirs, abs=0.01), (p, k)
    assert res["best"]["score"] == pytest.approx(max(v for p in ref for v in ref[p] if v is not None), abs=0.01)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_eval_layers_refuses_a_pooling_or_other_tasks(capsys):
    assert main(["eval", "--model", "paraphrase-MiniLM-L3-v2", "--layers", "--pooling", "mean"]) == 2
    assert "cannot be combined with --tasks or --pooling" in capsys.readouterr().err
    assert main(["eval", "--model", "paraphrase-MiniLM-L3-v2", "--plot", "x.png"]) == 2
    assert "add --layers" in capsys.readouterr().err


def test_an_experiment_searched_twice_compares_its_newest_search(tmp_path):
    """The README's `raysent compare` after its main job ran twice: the same configuration ids in two searches
    would pair seed 1 with seed 1 twice; the newest search is taken, and a glob picks the older one."""
    root = tmp_path / "results"
    for search, shift in (("20260101-000000", 0.0), ("20260202-000000", 5.0)):
        for cid in ("aaaa", "bbbb"):
            for s in (1, 2):
                curve = [{"step": 0, "dev_spearman": 50.0}, {"step": 10, "dev_spearman": 60.0 + shift + s + len(cid)}]
                write_run(root, "two", cid, s, {"temperature": 0.05 if cid == "aaaa" else 0.1}, phase="search",
                          search=search, dev_curve=curve)
    for a, b in (("aaaa", "bbbb"), ("two:aaaa", "two:bbbb")):
        res = compare([a, b], root, phase="search")
        assert res.baseline.search == "20260202-000000" and res.baseline.seeds == [1, 2]
        assert res.comparisons[0].tasks["dev"].a_mean == pytest.approx(np.mean([69.0 + 1, 69.0 + 2]))
    old = compare([str(root / "two" / "runs" / "search-20260101-*-aaaa-*.json"), "bbbb"], root, phase="search")
    assert old.baseline.search == "20260101-000000"

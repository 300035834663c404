"""Malformed configs and data files: each answered by one clear error naming file, line, field and
what is allowed; never a traceback from inside a library."""

from __future__ import annotations

import textwrap

import pytest

from raysent.config import load_config
from raysent.data import load
from raysent.errors import ConfigError, DataError

from conftest import cli_in_process, run_cli

GOOD = """\
name: ok
method: simcse-unsup
model:
  name: raw-bert-mini-mlm
data:
  train: sts-unlabeled
train:
  batch_size: 32
  lr: 1.0e-4
params:
  temperature: 0.05
"""


def write(tmp_path, text, name="exp.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_good_config_fills_paper_defaults(tmp_path):
    cfg = load_config(write(tmp_path, GOOD))
    assert cfg.train.max_length == 32 and cfg.train.eval_every == 125  # SimCSE's defaults
    assert cfg.params == {"pooling": "cls_mlp_train", "temperature": 0.05}
    assert cfg.train.lr == 1e-4  # the user's value wins


CONFIG_CASES = [
    # (yaml, substrings the message must contain)
    (GOOD.replace("train:\n  batch", "trian:\n  batch"),
     ["exp.yaml:7", "unknown key 'trian'", "did you mean 'train'", "allowed keys"]),
    (GOOD.replace("simcse-unsup", "simsce-unsup"),
     ["exp.yaml:2", "method", "'simsce-unsup'", "did you mean 'simcse-unsup'", "allowed:"]),
    (GOOD.replace("method: simcse-unsup\n", ""), ["'method' is missing", "allowed: simcse-unsup"]),
    (GOOD.replace("lr: 1.0e-4", "lr: fast"), ["exp.yaml:9", "train.lr", "'fast'", "number"]),
    (GOOD.replace("lr: 1.0e-4", "lr: -0.1"), ["exp.yaml:9", "train.lr", "-0.1", "greater than 0"]),
    (GOOD.replace("temperature: 0.05", "tempreture: 0.05"),
     ["exp.yaml:11", "unknown key 'tempreture' in params", "did you mean 'temperature'", "allowed keys: pooling, temperature"]),
    (GOOD.replace("temperature: 0.05", "temperature: 0"), ["exp.yaml:11", "params.temperature", "greater than 0"]),
    (GOOD + "  pooling: avg\n", ["exp.yaml:12", "params.pooling", "unknown pooling 'avg'", "cls_before_pooler"]),
    (GOOD.replace("sts-unlabeled", "stsbb"), ["exp.yaml:6", "data.train", "unknown data set 'stsbb'", "did you mean 'stsb'"]),
    (GOOD.replace("sts-unlabeled", "stsb:validation"), ["data.train", "no split 'validation'", "train, dev, test"]),
    (GOOD + "resources:\n  workers: 3\n", ["train.batch_size", "got 32", "split evenly", "workers=3"]),
    (GOOD + "search:\n  space:\n    temprature: {type: uniform, low: 0.01, high: 0.1}\n",
     ["exp.yaml:14", "search.space.temprature", "not a hyperparameter", "did you mean 'temperature'"]),
    (GOOD + "search:\n  space:\n    temperature: {type: loguniform, low: 0, high: 0.1}\n",
     ["exp.yaml:14", "search.space.temperature", "low > 0"]),
    (GOOD + "resources:\n  workers: 2\nsearch:\n  seeds: 3\n  scheduler: {type: asha}\n  space:\n"
     "    lr: {type: choice, values: [1.0e-5]}\n",
     ["exp.yaml:13", "resources.workers", "got 2", "seeds in turns", "allowed: null"]),
    (GOOD + "search:\n  space:\n    temperature: {type: choice, values: [0.05, -1]}\n",
     ["search.space.temperature", "-1", "not valid", "greater than 0"]),
    (GOOD.replace("name: ok", "name: my experiment"), ["exp.yaml:1", "name", "'my experiment'", "letters, digits"]),
    (GOOD + "eval:\n  tasks: [sts, glue]\n", ["eval.tasks.1", "'glue'", "'sts'", "'senteval'"]),
    (GOOD.replace("  lr: 1.0e-4", "  lr: 1.0e-4\n  adam_betas: [0.9, 1.5]"), ["exp.yaml:10", "train.adam_betas", "[0, 1)"]),
    (GOOD.replace("  lr: 1.0e-4", "  lr: 1.0e-4\n  adam_betas: [0.9]"),
     ["exp.yaml:10", "train.adam_betas", "got [0.9]", "two values", "[0.9, 0.999]"]),
    (GOOD + "seeds: [1, 1]\n", ["exp.yaml:12", "seeds: got [1, 1]", "seed 1 given more than once", "e.g. [1, 2]"]),
    # a key given twice, at any depth: PyYAML would keep the last value without a word
    (GOOD.replace("  lr: 1.0e-4", "  lr: 1.0e-4\n  lr: 3.0e-5"),
     ["exp.yaml:10", "train.lr", "the key 'lr' is given twice (first on line 9)", "remove one"]),
    (GOOD + "name: other\n", ["exp.yaml:12", "name:", "the key 'name' is given twice (first on line 1)"]),
    (GOOD + "search:\n  space:\n    temperature: {type: uniform, low: 0.01, high: 0.1, low: 0.02}\n",
     ["exp.yaml:14", "search.space.temperature.low", "given twice"]),
    (GOOD + "eval:\n  tasks: [sts]\n  sts_sets:\n    - stsb\n  tasks: [senteval]\n",
     ["exp.yaml:16", "eval.tasks", "given twice (first on line 13)"]),
    (GOOD.replace("  train: sts-unlabeled", "  train: sts-unlabeled\n  dev: wiki1m"),
     ["data.dev", "wiki1m", "holds sentences", "scored pairs are needed"]),
    (GOOD.replace("model:\n  name: raw-bert-mini-mlm\n", ""), ["model", "required field is missing"]),
    ("name: x\nmethod: [unclosed\n", ["exp.yaml:", "not valid YAML"]),
    ("", ["exp.yaml", "the file is empty", "name, method and model.name"]),
    ("- a\n- b\n", ["exp.yaml", "top level must be a mapping"]),
]


@pytest.mark.parametrize("text,expected", CONFIG_CASES, ids=[f"config{i}" for i in range(len(CONFIG_CASES))])
def test_malformed_config(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    for part in expected:
        assert part in msg, f"{part!r} not in:\n{msg}"


def test_duplicate_seeds_from_set_are_refused(tmp_path, capsys):
    """--set seeds=[1, 1] is validated as the file is: two runs of one (configuration, seed) at once left one
    record and two MLflow runs."""
    from raysent.cli import main

    path = write(tmp_path, GOOD)
    assert main(["tune", str(path), "--set", "seeds=[7, 7]", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "seeds: got [7, 7]: seed 7 given more than once" in err and "Traceback" not in err


def test_a_results_dir_that_is_a_file_is_named_as_a_file(tmp_path, capsys):
    """--results-dir of table, plot and compare, and tracking.results_dir of an experiment (tune, train, a suite's
    `set`): a file there, or above it, is named as a file, with exit status 2."""
    from raysent.cli import main

    blocker = tmp_path / "results.txt"
    blocker.write_text("")
    for where, why in ((blocker, "is a file, not a folder"), (blocker / "sub", f"cannot be a folder: {blocker} is a file")):
        for argv in (["table"], ["table", "exp"], ["plot", "exp"], ["compare", "exp", "exp2"]):
            assert main([*argv, "--results-dir", str(where)]) == 2
            err = capsys.readouterr().err
            assert err.startswith(f"raysent: error: --results-dir {where}: {why}; give the folder"), err

    path = write(tmp_path, GOOD + f"tracking:\n  results_dir: {blocker}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert f"exp.yaml:13: tracking.results_dir: got '{blocker}': is a file, not a folder" in str(info.value)
    for argv in (["train", str(path)], ["tune", str(path), "--dry-run"],
                 ["tune", str(write(tmp_path, GOOD, "ok.yaml")), "--set", f"tracking.results_dir={blocker}"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"tracking.results_dir: got '{blocker}': is a file, not a folder" in err and "Traceback" not in err
    suite = write(tmp_path, f"name: s\nset: {{tracking.results_dir: {blocker / 'sub'}}}\n"
                  f"experiments: [{{name: a, config: {tmp_path / 'ok.yaml'}}}]\n", "suite.yaml")
    assert main(["suite", str(suite), "--dry-run"]) == 2
    assert f"tracking.results_dir: got '{blocker / 'sub'}': cannot be a folder: {blocker} is a file" in \
        capsys.readouterr().err


DATA_CASES = [
    # (file name, content, substrings)
    ("pairs.tsv", "score\tsentence1\n1.0\ta\n", ["pairs.tsv line 1", "missing column(s) 'sentence2'", "score, sentence1, sentence2"]),
    ("pairs.tsv", "score\tsentence1\tsentence2\n1.0\ta\tb\n7.5\tc\td\n", ["pairs.tsv line 3", "score 7.5", "outside", "[0, 5]"]),
    ("pairs.tsv", "score\tsentence1\tsentence2\nhigh\ta\tb\n", ["pairs.tsv line 2", "'high' is not a number"]),
    ("pairs.tsv", "", ["pairs.tsv", "the file is empty"]),
    ("pairs.tsv", "score\tsentence1\tsentence2\n1.0\ta\tb\textra\n", ["pairs.tsv line 2", "4 field(s), expected 3", "tab"]),
    ("pairs.tsv", "score\tsentence1\tsentence2\n1.0\t\tb\n", ["pairs.tsv line 2", "sentence1 is empty"]),
    ("nli.tsv", "label\tpremise\thypothesis\nentailment\ta\tb\nmaybe\tc\td\n",
     ["nli.tsv line 3", "label 'maybe'", "contradiction, entailment, neutral"]),
    ("text.txt", "\n\n", ["text.txt", "empty", "one sentence per line"]),
    ("data.json", "{}", ["data.json", "unsupported file type '.json'", ".txt", ".tsv or .csv"]),
    ("odd.csv", "foo,bar\n1,2\n", ["odd.csv line 1", "cannot tell what the file holds", "'sentence' or 'text'"]),
    ("pairs.tsv", "score\tsentence1\tsentence2\n", ["pairs.tsv", "no data rows"]),
]


@pytest.mark.parametrize("name,content,expected", DATA_CASES, ids=[f"data{i}" for i in range(len(DATA_CASES))])
def test_malformed_data_file(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_text(content)
    kind = "nli_pairs" if name.startswith("nli") else ("scored_pairs" if name.startswith("pairs") else None)
    with pytest.raises(DataError) as info:
        load(f"path:{path}", kind)
    msg = str(info.value)
    for part in expected:
        assert part in msg, f"{part!r} not in:\n{msg}"


def test_missing_local_data_and_no_hub_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYSENT_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError) as info:
        load("stsb:dev")
    msg = str(info.value)
    assert "stsb:dev" in msg and str(tmp_path / "sts/STSB/dev.tsv") in msg
    assert "HF_HUB_OFFLINE" in msg and "princeton-nlp/datasets-for-simcse/senteval.tar" in msg
    assert "RAYSENT_DATA_DIR" in msg and "hf download" in msg


def test_missing_model_says_where_it_looked(monkeypatch, tmp_path):
    from raysent.errors import ModelError
    from raysent.models.encoder import Encoder

    monkeypatch.setenv("RAYSENT_MODEL_DIR", str(tmp_path))
    with pytest.raises(ModelError) as info:
        Encoder.load("google/bert-mini-nope")
    msg = str(info.value)
    assert str(tmp_path / "google/bert-mini-nope") in msg and str(tmp_path / "bert-mini-nope") in msg
    assert "HF_HUB_OFFLINE" in msg


def test_cli_prints_one_clear_line_and_exit_2(tmp_path):
    path = write(tmp_path, GOOD.replace("lr: 1.0e-4", "lr: fast"))
    proc = run_cli("train", str(path), check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("raysent: error: invalid experiment config")
    assert "train.lr" in proc.stderr


@pytest.mark.shared
def test_cli_bad_data_file_no_traceback(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("sent0\tsent1\n")
    path = write(tmp_path, GOOD.replace("sts-unlabeled", f"path:{bad}"))
    proc = cli_in_process("train", str(path), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "bad.tsv" in proc.stderr


def test_an_unwritable_results_folder_is_named_without_a_traceback(tmp_path, monkeypatch, capsys):
    """`table`/`plot` write beside the runs: a results folder they cannot write to (read-only for this user, a
    read-only mount, a file where a folder should be) is one line naming the path, exit 2."""
    import errno
    import shutil

    from raysent.cli import main
    from raysent.report import table as table_mod

    from conftest import REPO

    exp = "mini-supcon-searched"  # committed run files
    shutil.copytree(REPO / "results" / exp / "runs", tmp_path / exp / "runs")
    (tmp_path / exp / "plots").write_text("")  # a file where the plots folder goes
    assert main(["plot", exp, "--results-dir", str(tmp_path), "--kinds", "dev"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"raysent: error: cannot write {tmp_path / exp / 'plots'}: File exists") and \
        "Traceback" not in err

    def read_only(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(table_mod.Path, "write_text", read_only)
    assert main(["table", exp, "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "cannot write" in err and "Permission denied" in err and "--results-dir" in err

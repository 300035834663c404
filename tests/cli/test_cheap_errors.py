"""Errors in the command line or the experiment file come back before torch, Ray or MLflow is imported: a
missing, empty or malformed file, a bad --set, a bad --pooling, a pooling the model has no weights for, a missing or
unknown method, a field of the wrong type, a misspelt hyperparameter, a search over one, an unknown evaluation task
or STS set, `raysent tune` on a file without a search. The cases
run one after the other in one fresh interpreter (one start, not one per case), which notes after each what it has
imported: the test asserts on that, not on seconds (the CLI imported torch through raysent.api before it looked at
the file, 3-4 s for a file that does not exist)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "mlflow", "transformers", "optuna", "sentence_transformers")
PROBE = f"""\
import contextlib, io, json, sys
from raysent.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as exc:  # --help
            rc = exc.code
    out.append({{"rc": rc, "stderr": err.getvalue(), "imported": [m for m in {HEAVY!r} if m in sys.modules]}})
print(json.dumps(out))
"""

CASES = {
    "missing file": (["tune", "missing.yaml"], "missing.yaml: file not found"),
    "empty file": (["tune", "empty.yaml"], "empty.yaml: the file is empty"),
    "YAML syntax": (["tune", "syntax.yaml"], "syntax.yaml:3: not valid YAML"),
    "a tab": (["train", "tab.yaml"], "tab.yaml:2: not valid YAML: found character '\\t'"),
    "a key twice": (["tune", "twice.yaml", "--dry-run"], "twice.yaml:3: name: the key 'name' is given twice"),
    "an unknown method": (["tune", "typo.yaml"], "typo.yaml:2: method: got 'simcse-unsupp': unknown method (did you "
                          "mean 'simcse-unsup'?); allowed: simcse-unsup, simcse-sup, sg, sg-opt"),
    "no method": (["train", "nomethod.yaml"], "nomethod.yaml:1: 'method' is missing; allowed: simcse-unsup"),
    # the methods' descriptions are read from raysent.methods.spec, which imports no torch: 0.7 s, where 2.7-3 s
    "a field's type": (["train", "lr.yaml"], "lr.yaml:4: train.lr: got 'abc': Input should be a valid number"),
    "a misspelt hyperparameter": (["tune", "params.yaml"], "params.yaml:4: unknown key 'temprature' in params (did "
                                  "you mean 'temperature'?); allowed keys: pooling, temperature"),
    "a bad search value": (["tune", "space.yaml", "--dry-run"], "space.yaml:7: search.space.temperature: the value "
                           "-1.0 is not valid: got -1.0: Input should be greater than 0"),
    "an unknown task": (["tune", "task.yaml"], "task.yaml:4: eval.tasks.1: got 'stss': unknown evaluation task "
                        "'stss' (did you mean 'sts'?)"),
    "an unknown STS set": (["tune", "sets.yaml"], "sets.yaml:4: eval.sts_sets: got ['sts99']: unknown STS set"),
    "no search part": (["tune", "nosearch.yaml", "--dry-run"], "nosearch.yaml: `raysent tune` needs a 'search' part"),
    "no file named": (["tune"], "give the experiment YAML"),
    "bad --set": (["tune", "missing.yaml", "--set", "lr"], "--set 'lr': expected KEY=VALUE"),
    "bad --pooling": (["export", "raw-bert-mini-mlm", "out", "--pooling", "avg"], "unknown --pooling 'avg'; allowed:"),
    "bad --max-length": (["export", "raw-bert-mini-mlm", "out", "--max-length", "1"], "--max-length 1: expected"),
    "export onto a file": (["export", "raw-bert-mini-mlm", "empty.yaml"], "empty.yaml is a file"),
    # read from the checkpoint's safetensors header and the folder (raysent.models.locate): 0.45 s, where loading
    # the model to find out took 7.7 s, 7 of them importing torch and transformers
    "cls, no trained pooler": (["export", "raw-bert-mini-mlm", "out", "--pooling", "cls"],
                               "has no trained pooler weights; use 'cls_before_pooler'"),
    "layeratt, no pooler": (["export", "raw-bert-mini-mlm", "out", "--pooling", "layeratt"],
                            "needs the trained layer-wise attention pooler that the layeratt method saves"),
}


@pytest.mark.shared  # raw-bert-mini-mlm's files
def test_cheap_errors_are_one_line_before_torch_ray_or_mlflow(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    (tmp_path / "syntax.yaml").write_text("name: x\nmethod: [simcse-unsup\n")
    (tmp_path / "tab.yaml").write_text("name: x\n\tmethod: simcse-unsup\n")
    (tmp_path / "twice.yaml").write_text("name: x\nmethod: simcse-unsup\nname: y\n")
    (tmp_path / "typo.yaml").write_text("name: x\nmethod: simcse-unsupp\n")
    (tmp_path / "nomethod.yaml").write_text("name: x\nmodel: {name: raw-bert-mini-mlm}\n")
    head = "name: x\nmethod: simcse-unsup\nmodel: {name: raw-bert-mini-mlm}\n"
    (tmp_path / "lr.yaml").write_text(head + "train: {lr: abc}\n")
    (tmp_path / "params.yaml").write_text(head + "params: {temprature: 0.1}\n")
    (tmp_path / "task.yaml").write_text(head + "eval: {tasks: [sts, stss]}\n")
    (tmp_path / "sets.yaml").write_text(head + "eval: {sts_sets: [sts99]}\n")
    (tmp_path / "nosearch.yaml").write_text(head)
    (tmp_path / "space.yaml").write_text(head + "search:\n  algorithm: grid\n  space:\n"
                                         "    temperature: {type: choice, values: [0.05, -1.0]}\n")
    argvs = [argv for argv, _ in CASES.values()] + [["--help"], ["export", "--help"]]
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for (case, (argv, said)), res in zip(CASES.items(), got, strict=False):
        err = res["stderr"]
        assert res["rc"] == 2 and err.count("raysent: error:") == 1 and "Traceback" not in err, (case, err)
        assert said in err, (case, err)
        assert res["imported"] == [], f"{case}: raysent {' '.join(argv)} imported {res['imported']} before its error"
    assert [res["rc"] for res in got[len(CASES):]] == [0, 0] and got[-1]["imported"] == []  # --help: none either
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))  # export wrote nothing

"""Issue 60's battery, the part that needs no search: names that would leave the results folder, numbers that are
not finite, the experiment lock held by another process, search ids, a full disk (sqlite's and a real tmpfs's), the
leftovers of killed writes, and a final phase where one arm failed. tests/tune/test_safety_e2e.py runs the searches:
a disk that fills mid-search and its --resume, two searches of one experiment at once, an arm that fails."""

from __future__ import annotations

import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from raysent.config import NAME_MAX, load_config, parse_config
from raysent.errors import ConfigError
from raysent.io import is_disk_full, write_json_atomic
from raysent.report.summary import format_summary
from raysent.tune.diskspace import disk_full, space_needed, weights_bytes
from raysent.tune.driver import search_id
from raysent.tune.lock import SearchRunning, search_lock
from raysent.tune.state import ArmOutcome, Best, ScoreStat, Summary
from raysent.tune.storage import errored_for_space, remove_leftovers

from conftest import RAW_BERT, REPO, SHARED, cli_in_process

BASE = {"name": "safe", "method": "simcse-unsup", "model": {"name": RAW_BERT}, "data": {"train": "sts-unlabeled"}}


def config(tmp_path, **parts) -> dict:
    raw = {**BASE, "tracking": {"results_dir": str(tmp_path / "results")}}
    for part, fields in parts.items():
        raw[part] = {**raw.get(part, {}), **fields} if isinstance(fields, dict) else fields
    return raw


def refusal(raw: dict) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(raw)
    return str(err.value)


# --------------------------------------------------------------------------- names that become paths
@pytest.mark.parametrize("field, value", [
    ("tracking.experiment", "../../escape"), ("tracking.experiment", "/tmp/anywhere"),
    ("tracking.experiment", ".hidden"), ("tracking.registered_model", "org/model"), ("name", "a/b"),
    ("name", "x" * 300), ("tracking.experiment", "y" * (NAME_MAX + 1))])
def test_a_name_that_would_leave_the_results_folder_or_is_too_long_is_refused(tmp_path, field, value):
    part, _, key = field.rpartition(".")
    raw = config(tmp_path, **({part: {key: value}} if part else {}))
    if not part:
        raw[key] = value
    msg = refusal(raw)
    assert f"{field}: got " in msg and "letters, digits" in msg and f"at most {NAME_MAX} characters" in msg
    # the longest name allowed is taken
    ok = "z" * NAME_MAX
    parse_config({**raw, **({part: {**raw[part], key: ok}} if part else {key: ok})})


def test_a_refused_name_writes_nothing_not_even_the_mlflow_store(tmp_path):
    """`raysent tune` with `--set tracking.experiment=../../escape`: exit 2, and the results folder, the folders
    above it and MLflow's store are untouched (the escape wrote 124 files two levels up)."""
    results = tmp_path / "a" / "b" / "results"
    proc = cli_in_process("tune", "search_spaces/quick.yaml", "--set", "tracking.experiment=../../escape",
                          "--set", f"tracking.results_dir={results}", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "tracking.experiment: got '../../escape'" in proc.stderr and "Traceback" not in proc.stderr
    assert list(tmp_path.rglob("*")) == []


# --------------------------------------------------------------------------- finite numbers only
def test_inf_and_nan_are_refused_naming_the_field_the_file_gave(tmp_path):
    (tmp_path / "e.yaml").write_text(textwrap.dedent(f"""\
        name: e
        method: simcse-unsup
        model: {{name: {RAW_BERT}}}
        params: {{temperature: .inf}}
        tracking: {{results_dir: {tmp_path}}}
        search:
          space:
            lr: {{type: loguniform, low: 1.0e-5, high: 1.0e-4}}
        """))
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "e.yaml")
    msg = str(err.value)
    # it was blamed on search.space.lr with "got None" (to_dict wrote inf as null)
    assert "e.yaml:4: params.temperature: got inf: allowed: a finite number" in msg and "search.space" not in msg
    for part, fields, named in [("train", {"lr": float("nan")}, "train.lr"),
                                ("train", {"grad_clip": float("inf")}, "train.grad_clip"),
                                ("model", {"dropout": float("nan")}, "model.dropout"),
                                ("search", {"space": {"lr": {"type": "uniform", "low": 0.0, "high": float("inf")}}},
                                 "search.space.lr.high")]:
        assert f"{named}: got " in refusal(config(tmp_path, **{part: fields})), named


def test_an_override_of_inf_names_the_field_and_the_override(tmp_path):
    proc = cli_in_process("tune", "search_spaces/quick.yaml", "--set", "lr=.inf", "--dry-run",
                          "--set", f"tracking.results_dir={tmp_path}", check=False)
    assert proc.returncode == 2
    assert "train.lr: got inf: allowed: a finite number (not inf or NaN)" in proc.stderr
    assert "(with the overrides lr=inf, tracking.results_dir=" in proc.stderr


# --------------------------------------------------------------------------- one search per experiment folder
HOLDER = """\
import sys, time
from pathlib import Path
from raysent.tune.lock import search_lock
with search_lock(Path(sys.argv[1])) as lock:
    lock.name("20261203-101500-042")
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_second_search_is_refused_with_the_holders_id_and_process_until_it_dies(tmp_path):
    """Two processes: the first holds the experiment's lock, the second is refused with its search id and pid;
    SIGKILL of the first (no clean-up runs) frees the folder, as the operating system releases an flock."""
    exp = tmp_path / "exp"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(exp)], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SearchRunning) as err, search_lock(exp):
            pass
        msg = str(err.value)
        assert f"search 20261203-101500-042, process {holder.pid} on " in msg and str(exp) in msg
        assert "--set name=NEW" in msg
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=30)
    with search_lock(exp) as lock:  # the dead process's lock is gone: no stale file to remove by hand
        lock.name("next")
        assert json.loads((exp / ".search.lock").read_text())["pid"] == os.getpid()


def test_search_ids_do_not_repeat_within_a_second_and_sort_as_they_started():
    t = datetime(2026, 12, 3, 10, 15, 0, 1000)
    ids = [search_id(t + timedelta(milliseconds=ms)) for ms in (0, 1, 999, 1000)]
    assert ids[0] == "20261203-101500-001" and len(set(ids)) == 4 and ids == sorted(ids)
    old = "20261203-101500"  # an id before 2026-12, to the second: before the ones of its second, after the earlier
    assert sorted([ids[1], old, "20261203-101459"]) == ["20261203-101459", old, ids[1]]


# --------------------------------------------------------------------------- a full disk
def test_sqlite_full_through_sqlalchemy_and_enospc_read_as_a_full_disk(tmp_path):
    """A real SQLITE_FULL (the store capped at its pages: the error sqlite gives on a full disk), through SQLAlchemy
    as MLflow's store meets it, and a real ENOSPC from /dev/full; another error is not one."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(sqlalchemy.exc.OperationalError) as full, engine.begin() as c:
        c.exec_driver_sql("PRAGMA max_page_count = 2")
        c.exec_driver_sql("CREATE TABLE runs (x TEXT)")
        for _ in range(100):
            c.exec_driver_sql("INSERT INTO runs VALUES (?)", ("y" * 4000,))
    assert "database or disk is full" in str(full.value) and is_disk_full(full.value)
    with pytest.raises(OSError) as nospace, open("/dev/full", "w") as fh:
        fh.write("x" * 10)
        fh.flush()
    assert nospace.value.errno == errno.ENOSPC and is_disk_full(nospace.value)
    try:
        raise RuntimeError("a trial failed") from nospace.value  # Ray's error around it
    except RuntimeError as wrapped:
        assert is_disk_full(wrapped)
    assert not is_disk_full(sqlite3.OperationalError("database disk image is malformed"))
    assert not is_disk_full(ValueError("the loss became nan"))


def unshare_works() -> bool:
    probe = subprocess.run(["unshare", "--mount", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


def on_small_disk(folder: Path, kib: int, script: str) -> subprocess.CompletedProcess:
    """``script`` (Python) run with ``folder`` a tmpfs of ``kib`` KiB, in a mount namespace of its own."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = f"mount -t tmpfs -o size={kib}k tmpfs '{folder}' && exec '{sys.executable}' -c \"$0\""
    return subprocess.run(["unshare", "--mount", "sh", "-c", cmd, script], capture_output=True, text=True, cwd=REPO,
                          timeout=120)


@pytest.mark.skipif(not unshare_works(), reason="needs `unshare --mount` (a small tmpfs of the test's own)")
def test_a_record_written_on_a_full_disk_leaves_no_temporary_file(tmp_path):
    disk = tmp_path / "disk"
    proc = on_small_disk(disk, 64, textwrap.dedent(f"""\
        import os
        from pathlib import Path
        from raysent.io import write_json_atomic
        runs = Path({str(disk)!r}) / "runs"
        try:
            write_json_atomic(runs / "search-r-abc-seed1.json", {{"curve": ["x" * 1000] * 200}})
        except OSError as exc:
            print("errno", exc.errno)
        print("left", sorted(os.listdir(runs)))
        """))
    assert proc.returncode == 0, proc.stderr
    assert f"errno {errno.ENOSPC}" in proc.stdout and "left []" in proc.stdout, proc.stdout


def test_the_full_disk_error_names_the_folder_the_space_and_the_way_on(tmp_path):
    cfg = parse_config(config(tmp_path, search={"seeds": 2, "max_concurrent_trials": 2, "space": {
        "lr": {"type": "choice", "values": [1e-5, 1e-4, 3e-4]}}}, seeds=[1, 2]))
    size = weights_bytes(RAW_BERT)
    assert size == (SHARED / "models" / RAW_BERT / "model.safetensors").stat().st_size
    # 6 search runs and 2 × 2 final runs keep a best model each; 2 trials at once hold 6 copies each besides
    assert space_needed(cfg, search_runs=6) == size * (6 + 4 + 2 * 6)
    keep = parse_config({**cfg.to_dict(), "search": {**cfg.to_dict()["search"], "keep_checkpoints": True}})
    assert space_needed(keep, search_runs=6) == size * (6 + 4 + 2 * 6 + 3 * 10)
    msg = str(disk_full(tmp_path / "results" / "safe", space_needed(cfg, 6), "exp.yaml"))
    assert msg.startswith(f"the disk of {tmp_path / 'results' / 'safe'} ran out of space (")
    assert f"needs about {size * 22 / 1e6:.0f} MB at most" in msg and "`raysent tune exp.yaml --resume`" in msg
    assert space_needed(parse_config({**BASE, "model": {"name": "org/not-downloaded"}}), 4) is None


def test_leftovers_of_killed_writes_are_removed_and_nothing_else(tmp_path):
    exp = tmp_path / "exp"
    keep = [exp / "state.json", exp / ".search.lock", exp / "runs" / "search-r-abc-seed1.json",
            exp / "search" / "r" / "t1" / "best" / "model.safetensors", exp / "tune" / "search-r" / ".best-x" / "f"]
    gone = [exp / ".state.json.abc123", exp / "runs" / ".search-r-abc-seed1.json.k2j", exp / "stopped" / ".s.json.1",
            exp / "search" / "r" / "t1" / ".best-9x" / "model.safetensors", exp / "final" / "r" / "seed1" / ".ckpt-1" / "s",
            exp / "search" / "r" / "t2" / ".checkpoint.old" / "s"]
    for p in keep + gone:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")
    assert remove_leftovers(exp) == 6
    assert all(p.exists() for p in keep)  # tune/ is Ray's: not swept
    assert not any(p.exists() for p in gone)
    assert not (exp / "search" / "r" / "t1" / ".best-9x").exists()


def test_trials_that_failed_for_lack_of_space_are_found_and_no_others(tmp_path):
    run = tmp_path / "search-r"
    for trial, pkl, txt in [("a", b"", None), ("b", b"x", "OSError: [Errno 28] No space left on device"),
                            ("c", b"x", "NonFiniteLossError: the loss became nan"), ("d", None, None)]:
        (run / trial).mkdir(parents=True)
        if pkl is not None:
            (run / trial / "error.pkl").write_bytes(pkl)
        if txt is not None:
            (run / trial / "error.txt").write_text(txt)
    assert errored_for_space(str(run)) == 2
    assert errored_for_space(str(run), since=time.time() + 60) == 0  # an earlier search's failures are not this one's
    assert errored_for_space("s3://bucket/search-r") == 0


# --------------------------------------------------------------------------- one arm failed
def test_the_summary_of_a_final_phase_whose_warm_start_arm_failed_keeps_the_searched_arm():
    scores = {f"sts/{t}": ScoreStat(mean=70.0, std=1.0, n=2)
              for t in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "avg")}
    summary = Summary(experiment="e", results="/r/e", search="r1", best=Best(config_id="b", hp={"lr": 1e-4}),
                      final=ArmOutcome(seeds=[1, 2], scores=scores),
                      paper=ArmOutcome(seeds=[], missing_seeds=[1, 2],
                                       errors=["NonFiniteLossError: the loss became nan at step 3"]),
                      warm_source="paper")
    text = format_summary(summary)
    assert "FAILED: no seed of the paper arm finished (2 failed): NonFiniteLossError: the loss became nan" in text
    assert "70.00±1.00" in text  # the searched arm's row


def test_json_written_atomically_still_replaces(tmp_path):
    write_json_atomic(tmp_path / "s.json", {"a": 1})
    write_json_atomic(tmp_path / "s.json", {"a": 2})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": 2} and os.listdir(tmp_path) == ["s.json"]

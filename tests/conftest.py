"""Shared test setup: real data and models from ../shared (never copied into the repo)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

os.environ.setdefault("RAYSENT_DATA_DIR", str(SHARED / "data"))
os.environ.setdefault("RAYSENT_MODEL_DIR", str(SHARED / "models"))
# Ray workers do not run in this folder: a relative path (CI passes ../shared/...) must become absolute
# before the session's Ray starts, or workers started by the tests themselves look in the wrong place.
for _var in ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR"):
    os.environ[_var] = str(Path(os.environ[_var]).resolve())
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of waiting on the network
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# Under pytest-xdist (pyproject's addopts: -n 2) each worker trains on its share of the cores: two workers with
# torch's default of one thread per core oversubscribe the machine, and OpenMP threads then spin against each
# other. Processes a test starts (raysent commands, Ray's workers) inherit the share through OMP_NUM_THREADS.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))

# The untuned model's dev scores (raysent.train.initial_dev) are shared by this run's tests through one cache folder,
# made by the first process (xdist's controller, whose workers and their Ray inherit it) and removed at its end: a
# run never reads what an earlier run (older code, another user's cache) stored.
if "PYTEST_XDIST_WORKER" not in os.environ:
    os.environ["RAYSENT_CACHE_DIR"] = tempfile.mkdtemp(prefix="raysent-test-cache-")

RAW_BERT = "raw-bert-mini-mlm"  # 4-layer MLM-only BERT: a raw starting point
PARAPHRASE = "paraphrase-MiniLM-L3-v2"


SHARED_MISSING = [f"{var}={os.environ[var]}" for var in ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR")
                  if not Path(os.environ[var]).is_dir()]


# --------------------------------------------------------------------------- the longest files first
# xdist (--dist loadfile) hands whole files to its two workers in the collection's order (pyproject's addopts turn
# off its own reordering by test count, which put the 409 s test_tune.py, 4 tests, after 28 files): the files the
# last whole-suite run measured longest go first, so that neither worker is left with a long file at the end. On
# 2026-11-28 the two workers ended 172 s apart in that order (1,342 s and 1,514 s). A file missing from
# durations.json goes last. RAYSENT_TEST_DURATIONS=PATH writes the measured seconds per file at the end of a run;
# copy that file to tests/durations.json after a whole-suite run on idle cores.
DURATIONS = Path(__file__).parent / "durations.json"
_SECONDS: dict[str, float] = json.loads(DURATIONS.read_text())["seconds"] if DURATIONS.is_file() else {}


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    """The longest files first (above). Without ../shared, the tests marked ``shared`` (real data or models) are
    skipped, saying why; the others (losses, poolings on a tiny random BERT, schemas, reports, the layer check)
    still run."""
    items.sort(key=lambda item: -_SECONDS.get(_file_of(item.nodeid), 0.0))  # stable: a file's own order stays
    if not SHARED_MISSING:
        return
    skip = pytest.mark.skip(reason=f"needs ../shared: {', '.join(SHARED_MISSING)} is not a folder")
    for item in items:
        if "shared" in item.keywords:
            item.add_marker(skip)


# --------------------------------------------------------------------------- the fast tier trains nothing, imports no Ray
# `pytest -m "not slow"` keeps that promise: a test not marked slow fails when it, one of its fixtures, or a
# process it starts (a `raysent` command among them) enters the training loop or imports ray. In this process
# that is the first import of ray: once a slow test has imported it (the whole suite), a live Ray imports its
# own modules at any time, and only the fast tier sees every test. So test modules import ray inside the (slow)
# tests that use it, never as they are collected.
FAST_TIER = Path(__file__).parent / "fast_tier"
_spec = importlib.util.spec_from_file_location("raysent_fast_tier_guard", FAST_TIER / "sitecustomize.py")
assert _spec is not None and _spec.loader is not None
guard = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(guard)
_GUARDED = pytest.StashKey[dict]()
_fast_test: list[str] = []  # the node id of the fast test running now


def _train_in_a_fast_test(what: str) -> None:
    if _fast_test:
        pytest.fail(f"{_fast_test[0]} is not marked slow but trains ({what}): mark it slow or make it not train",
                    pytrace=False)


guard.watch_training(_train_in_a_fast_test)


def _fast_tier_problems(state: dict) -> list[str]:
    """What the running fast test did against the promise since the last look: ray imported here, or a started
    process that trained or imported ray."""
    problems = []
    if not state["ray"] and "ray" in sys.modules:
        state["ray"] = True
        problems.append("imports ray")
    lines = state["report"].read_text().splitlines()
    for line in lines[state["lines"]:]:
        seen = json.loads(line)
        did = " and ".join(d for d in (f"trains ({seen['trained'][0]})" if seen["trained"] else "",
                                       f"imports ray ({', '.join(seen['ray'])}, ...)" if seen["ray"] else "") if d)
        problems.append(f"starts a process that {did}: {' '.join(seen['argv'])}")
    state["lines"] = len(lines)
    return problems


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("slow"):
        return
    fd, report = tempfile.mkstemp(prefix="raysent-fast-tier-", suffix=".jsonl")
    os.close(fd)
    item.stash[_GUARDED] = {"ray": "ray" in sys.modules, "report": Path(report), "lines": 0,
                            "env": {k: os.environ.get(k) for k in ("PYTHONPATH", guard.REPORT_ENV)}}
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAST_TIER), os.environ.get("PYTHONPATH")) if p)
    os.environ[guard.REPORT_ENV] = report
    _fast_test[:] = [item.nodeid]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    state = item.stash.get(_GUARDED, None)
    if state is None:
        return report
    problems = _fast_tier_problems(state)
    if call.when == "teardown":
        _fast_test.clear()
        for key, value in state["env"].items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        state["report"].unlink(missing_ok=True)
    if problems:
        said = (f"{item.nodeid} is not marked slow, but it " + "; it ".join(problems) +
                '.\nThe fast tier (pytest -m "not slow") trains nothing and imports no Ray: mark the test slow, or '
                "make it need neither.")
        if report.passed:
            report.outcome, report.longrepr = "failed", said
        else:
            report.sections.append(("fast tier", said))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    before = "ray" in sys.modules
    report = yield
    if isinstance(collector, pytest.Module) and report.passed and not before and "ray" in sys.modules:
        report.outcome = "failed"
        report.longrepr = (f"{collector.nodeid} imports ray as it is collected: import it inside the slow tests "
                           "that use it, or no test not marked slow can be caught importing it (tests/conftest.py)")
    return report


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> str:
    """A tiny random BERT (2 layers, hidden 32) with a character-level WordPiece vocabulary, saved as a model
    folder: for tests of shapes, gradients and invariants that do not depend on trained weights."""
    import string

    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out = tmp_path_factory.mktemp("tiny-bert")
    chars = string.ascii_lowercase + string.digits + ".,'!?-"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=str(out / "vocab.txt"), do_lower_case=True).save_pretrained(out)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128)
    model = BertModel(config)
    # 512 positions, as BERT's (eval.max_length 256 fits; preflight refuses a max_length beyond a model's positions),
    # drawn after every other weight: the first 128 rows and the rest are the weights the tests were tuned on
    positions = torch.nn.Embedding(512, config.hidden_size)
    with torch.no_grad():
        positions.weight[:128] = model.embeddings.position_embeddings.weight
        positions.weight[128:].normal_(0.0, config.initializer_range, generator=torch.Generator().manual_seed(1))
    model.embeddings.position_embeddings = positions
    model.config.max_position_embeddings = 512
    model.save_pretrained(out)
    return str(out)


@pytest.fixture(scope="session")
def raw_encoder():
    from raysent.models.encoder import Encoder

    return Encoder.load(RAW_BERT)


def run_cli(*args: str, check: bool = True, env: dict | None = None, one_stream: bool = False,
            timeout: float | None = None):
    """Run the installed `raysent` command in a subprocess; returns CompletedProcess (``one_stream``: stderr
    into stdout, in the order a terminal shows them; ``timeout``: seconds after which a hang fails the test)."""
    import subprocess

    full_env = {**os.environ, **(env or {})}
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if one_stream else {"capture_output": True}
    proc = subprocess.run([sys.executable, "-m", "raysent.cli", *args], text=True, **streams, env=full_env,
                          cwd=REPO, timeout=timeout)
    return _checked(proc, args, check)


def _checked(proc, args: tuple[str, ...], check: bool):
    if check and proc.returncode != 0:
        raise AssertionError(f"raysent {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def cli_in_process(*args: str, check: bool = True, one_stream: bool = False):
    """`raysent ARGS` through :func:`raysent.cli.main` in this process, as :func:`run_cli` runs it (from the
    repository, both streams captured; ``one_stream``: stderr into stdout, in order); returns a CompletedProcess.
    A new process pays Python's start and the imports again, 5-7 CPU-s for a command that loads a model (torch,
    transformers, scipy; 2026-11-29, a whole-suite run: 85 `raysent` processes took ~700 of its 2,680 CPU-s). For
    commands that need no process of their own: not one that is signalled, starts a Ray of its own (a test that runs
    a search this way asks for ``ray_cluster``: the search joins the session's Ray, as ``RAY_ADDRESS`` makes a
    `raysent` process do), reads the machine's resources (with the session's Ray up in this process, preflight reads
    that Ray's), or whose time to its first error is what the test measures (tests/cli/test_cheap_errors.py)."""
    import contextlib
    import io
    import subprocess
    from unittest import mock

    import raysent.cli.suite
    import raysent.cli.train
    import raysent.cli.tune
    from raysent.cli import main

    ray = sys.modules.get("ray")
    had_ray = ray is not None and ray.is_initialized()
    out = io.StringIO()
    err = out if one_stream else io.StringIO()
    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.chdir(REPO))
        stack.enter_context(contextlib.redirect_stdout(out))
        stack.enter_context(contextlib.redirect_stderr(err))
        if had_ray:  # `raysent train`/`tune`/`suite` leave Ray when they end: here that is the session's, kept
            for module in (raysent.cli.suite, raysent.cli.train, raysent.cli.tune):
                stack.enter_context(mock.patch.object(module, "disconnect_ray", lambda: None))
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse: --help, a bad option
            code = exc.code if isinstance(exc.code, int) else 2
    assert not had_ray or sys.modules["ray"].is_initialized(), f"raysent {' '.join(args)} left this process's " \
        "Ray: run it with run_cli"
    return _checked(subprocess.CompletedProcess(["raysent", *args], code, out.getvalue(),
                                                None if one_stream else err.getvalue()), args, check)


def json_summary_last(output: str, before: str) -> dict:
    """The JSON summary of `raysent … --format json` run with ``one_stream``: it must come last, after
    ``before`` and every other line Ray forwarded (Ray holds back log lines that repeat across workers until
    the driver disconnects)."""
    import json

    logs, brace, rest = output.rpartition("\n{\n")
    assert brace and before in logs, output[-3000:]
    return json.loads(brace + rest)


@pytest.fixture
def trial_in_this_process(monkeypatch):
    """For a test that runs a trial's code in its own process (raysent.tune.reporter.MemoryReporter): what a trial's
    process sets in itself is put back afterwards. ``CUDA_VISIBLE_DEVICES``, which ``claim_devices`` sets to "" when
    Ray gave the trial no GPU: left so by tests/tune/test_seeds.py, it reached the autoscaling test's head on the same
    xdist worker, whose fake GPU nodes then failed to start ("Attempting to start raylet with 1 GPU, but
    CUDA_VISIBLE_DEVICES contains []", monitor.log, a whole-suite run of 2026-12-04: the search waited 300 s for
    GPUs). And ``sys.unraisablehook`` (``prepare_process``)."""
    name = "CUDA_VISIBLE_DEVICES"
    if name in os.environ:
        monkeypatch.setenv(name, os.environ[name])
    else:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for the whole test session (starting Ray costs seconds and ~2 GB).

    Yields the address, so `raysent` subprocesses join the same Ray through RAY_ADDRESS.
    """
    import ray

    from raysent.config import parse_config
    from raysent.train.ray_train import init_ray

    if not ray.is_initialized():
        # started as `raysent train` / `raysent tune` start a local Ray (LOCAL_RAY_ENV included), a cluster in
        # RAY_ADDRESS joined as it is
        cfg = parse_config({"name": "tests", "method": "simcse-unsup", "model": {"name": RAW_BERT}}, source="<tests>")
        # no dashboard: no test needs it, and two of them (one Ray per xdist worker) took ~70 CPU-seconds of a
        # full test run (docs/testing.md). No idle worker processes kept ready and no metrics: an idle local Ray
        # burnt 4.4 CPU-s a minute, 2.8 without them (2026-11-28), and each xdist worker holds one for the session.
        # Its log monitor looks for new log files every 0.5 s instead of every 0.1 s (Ray does so past 1,000 files):
        # with the 207 files of 60 finished actors it took 1.88 CPU-s a minute, 1.04 so; in a whole-suite run the two
        # sessions' monitors took 52 CPU-s, the most of any of their Ray processes (2026-11-29)
        for knob in ("RAY_num_workers_soft_limit", "RAY_enable_metrics_collection",
                     "RAY_LOG_MONITOR_MANY_FILES_THRESHOLD"):
            os.environ.setdefault(knob, "0")
        init_ray(cfg, log_to_driver=False, num_cpus=2, include_dashboard=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def tiny_experiment(tmp_path, name: str, search: str, seeds: str, sts_sets: str = "null", max_steps: int = 4,
                    tracking: str = "", resources: str = "", model: str = RAW_BERT) -> str:
    """A tiny SimCSE search on raw-bert-mini-mlm (256 STS sentences, a few steps) written to tmp_path; its
    results under tmp_path/results. Evaluation in batches of 64: on one thread raw-bert-mini-mlm scores SICK-R
    dev in 1.1 s, in batches of 256 in 1.3 s, to the same score (2026-11-29)."""
    text = f"""\
name: {name}
method: simcse-unsup
model: {{name: {model}}}
data: {{train: sts-unlabeled, dev: sickr:dev, max_train_samples: 256}}
train: {{batch_size: 16, max_steps: {max_steps}, eval_every: 2, max_length: 24, lr: 1.0e-4, eval_at_start: false}}
params: {{pooling: mean}}
eval: {{tasks: [sts], sts_sets: {sts_sets}, batch_size: 64, max_length: 64}}
seeds: {seeds}
resources: {{cpus_per_worker: 0.9{resources}}}
tracking: {{results_dir: {tmp_path / 'results'}{tracking}}}
search:
{search}
"""
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return str(path)


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if os.environ.get("RAYSENT_TEST_DURATIONS"):
        _measured[_file_of(report.nodeid)] = _measured.get(_file_of(report.nodeid), 0.0) + report.duration


def pytest_sessionfinish(session):
    """In the first process (xdist's controller, which sees every worker's reports): remove the run's cache folder and,
    with RAYSENT_TEST_DURATIONS=PATH, write the seconds per file of this run in tests/durations.json's form."""
    if hasattr(session.config, "workerinput"):
        return
    shutil.rmtree(os.environ["RAYSENT_CACHE_DIR"], ignore_errors=True)
    out = os.environ.get("RAYSENT_TEST_DURATIONS")
    if out and _measured:
        Path(out).write_text(json.dumps({"measured": "seconds per file, setup to teardown", "seconds": dict(
            sorted(((k, round(v, 1)) for k, v in _measured.items()), key=lambda kv: -kv[1]))}, indent=1) + "\n")

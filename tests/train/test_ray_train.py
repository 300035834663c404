"""Ray Train on 2 CPU workers (gloo): one step equals one worker's step on the global batch (in fp32, and in
bf16 against fp32), a dying worker is replaced and the run resumes exactly, and `raysent train` on 2 workers
improves a raw encoder."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from raysent.config import load_config, parse_config, with_overrides
from raysent.data.batching import local_part
from raysent.methods import Gatherer
from raysent.train.records import TrainSummary

from conftest import RAW_BERT, cli_in_process, json_summary_last, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.shared]

# (method, data, params, train): dropout off everywhere so that both sides see the same views; the last
# case trains through a gradient cache (no DDP: the workers average their gradients themselves), and is
# compared with the plain one-worker step on the whole global batch
CASES = [
    ("simcse-unsup", "sts-unlabeled", {"pooling": "cls_mlp_train"}, {}),
    ("simcse-sup", "nli-triplets", {"hard_negative_weight": 0.5}, {}),
    ("sg-opt", "sts-unlabeled", {"loss": "opt3"}, {}),
    ("simcse-unsup", "sts-unlabeled", {"pooling": "cls_mlp_train"}, {"grad_cache_rows": 3}),
]
# the same steps in bf16 (train.precision), global negatives only: the embeddings are gathered in bf16 as they are
# (gloo all-gathers and all-reduces bf16), the gradient cache's two passes run under autocast
BF16_CASES = [
    ("simcse-unsup", "sts-unlabeled", {"pooling": "cls_mlp_train"}, {"precision": "bf16"}),
    ("simcse-sup", "nli-triplets", {"hard_negative_weight": 0.5}, {"precision": "bf16"}),
    ("sg-opt", "sts-unlabeled", {"loss": "opt3"}, {"precision": "bf16"}),
    ("simcse-unsup", "sts-unlabeled", {"pooling": "cls_mlp_train"}, {"grad_cache_rows": 3, "precision": "bf16"}),
]
GLOBAL_ROWS = 8


def case_config(method: str, data: str, params: dict, gather: bool = True, train: dict | None = None):
    return parse_config({
        "name": "equiv", "method": method, "model": {"name": RAW_BERT, "dropout": 0.0}, "params": params,
        "data": {"train": data, "max_train_samples": 64},
        "train": {"batch_size": GLOBAL_ROWS, "max_length": 24, "gather_negatives": gather, **(train or {})},
    })


class DtypeRecorder(Gatherer):
    """A gatherer that notes the dtype of every tensor gathered with gradient."""

    def __init__(self, inner: Gatherer):
        self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size
        self.dtypes: list[torch.dtype] = []

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.dtypes.append(x.dtype)
        return self.inner(x)

    def gather_nograd(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner.gather_nograd(x)


def one_step(cfg, rank: int = 0, world: int = 1, hooks=None, gathered: list | None = None) -> tuple[float, dict]:
    """Loss and gradients of one step on rows 0..GLOBAL_ROWS-1 (this worker's share of them), through
    the loop's forward and backward (and its gradient cache when the config asks for one), under the
    autocast of ``train.precision``; ``gathered`` collects the dtypes the workers gathered."""
    import functools

    from raysent.train.loop import autocast, forward_backward
    from raysent.train.run import build_method, prepare_data

    torch.manual_seed(0)  # same heads on every side (DDP also broadcasts rank 0's weights)
    method = build_method(cfg)
    data, _, _ = prepare_data(cfg, method)
    model = method
    cache = cfg.train.grad_cache_rows
    if hooks is not None:
        gatherer = DtypeRecorder(hooks.gatherer())
        method.set_gatherer(gatherer)
        model = hooks.wrap(method, ddp=not cache)
    model.train()
    batch = data.collate(local_part(np.arange(GLOBAL_ROWS), rank, world))
    loss = forward_backward(model, method, batch, grad_cache=cache,
                            autocast=functools.partial(autocast, cfg.train.precision, torch.device("cpu")))
    if hooks is not None and gathered is not None:
        gathered.extend(gatherer.dtypes)
    if hooks is not None and cache:
        hooks.sync_gradients(method)
    grads = {n: p.grad.detach().clone() for n, p in method.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads


def _worker(config: dict) -> None:
    """Every case on this Ray Train worker; rank r writes its losses (and rank 0 its grads)."""
    import ray.train

    from raysent.train.ray_train import RayHooks

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    out = {}
    for method, data, params, train in CASES:
        for gather in (True, False):
            cfg = case_config(method, data, params, gather, train)
            loss, grads = one_step(cfg, rank, world, RayHooks(cfg))
            out[(method, gather, str(train))] = (loss, grads if rank == 0 else None)
    for method, data, params, train in BF16_CASES:
        cfg = case_config(method, data, params, True, train)
        gathered: list = []
        loss, grads = one_step(cfg, rank, world, RayHooks(cfg), gathered)
        out[(method, True, str(train))] = (loss, grads if rank == 0 else None, gathered)
    torch.save(out, os.path.join(config["dir"], f"rank{rank}.pt"))


@pytest.fixture(scope="module")
def two_worker_steps(ray_cluster, tmp_path_factory) -> list[dict]:
    """Every case's step on 2 Ray Train workers (one TorchTrainer for all): per rank, its results by case."""
    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    tmp_path = tmp_path_factory.mktemp("equiv")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # fit() leaves its Ctrl-C handler installed, and that handler keeps the run's controller and DatasetManager
    # actors alive, polling (1.4 CPU-s a minute), for the rest of the session: put the one from before back, as
    # raysent.train.ray_train.train_one_with_ray does
    sigint = signal.getsignal(signal.SIGINT)
    try:
        TorchTrainer(_worker, train_loop_config={"dir": str(tmp_path)}, torch_config=TorchConfig(backend="gloo"),
                     scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                     run_config=RunConfig(name="equiv", storage_path=str(tmp_path / "ray"))).fit()
    finally:
        signal.signal(signal.SIGINT, sigint)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_two_workers_equal_one_worker_on_the_global_batch(two_worker_steps):
    ranks = two_worker_steps
    for method, data, params, train in CASES:
        key = str(train)
        label = f"{method} {train or ''}"
        # global negatives: mean of the two workers' losses and DDP's averaged gradients equal the
        # one-worker step over all GLOBAL_ROWS rows
        ref_loss, ref_grads = one_step(case_config(method, data, params))
        loss = np.mean([ranks[r][(method, True, key)][0] for r in range(2)])
        assert loss == pytest.approx(ref_loss, abs=1e-5), label
        _assert_grads_equal(ranks[0][(method, True, key)][1], ref_grads, label)
        # local negatives: the mean of each half computed on its own
        cfg = case_config(method, data, params, gather=False)
        halves = [one_step(cfg, r, 2) for r in range(2)]
        loss = np.mean([ranks[r][(method, False, key)][0] for r in range(2)])
        assert loss == pytest.approx(np.mean([h[0] for h in halves]), abs=1e-5), label
        assert abs(loss - ref_loss) > 1e-3, f"{label}: local and global negatives must differ"
        local_ref = {n: (halves[0][1][n] + halves[1][1][n]) / 2 for n in halves[0][1]}
        _assert_grads_equal(ranks[0][(method, False, key)][1], local_ref, label)


def _assert_grads_equal(got: dict, want: dict, label: str) -> None:
    assert set(got) == set(want), label
    assert len(want) > 20, label
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=1e-4, msg=f"{label}: {name}")


def test_two_workers_in_bf16_equal_one_worker_in_fp32(two_worker_steps):
    """Autocast, the all-gather of bf16 embeddings over gloo (with its gradient, all-reduced in bf16) and DDP's
    averaging: the mean loss and rank 0's gradients equal the fp32 one-worker step on the global batch to bf16's
    precision (the tolerances of tests/train/test_precision.py)."""
    from test_precision import assert_close_in_bf16

    ranks = two_worker_steps
    for method, data, params, train in BF16_CASES:
        label = f"{method} {train}"
        ref_loss, ref_grads = one_step(case_config(method, data, params))
        results = [ranks[r][(method, True, str(train))] for r in range(2)]
        for _, _, gathered in results:  # every worker gathered bf16 tensors (the embeddings, as computed)
            assert gathered and set(gathered) == {torch.bfloat16}, f"{label}: {gathered}"
        loss = float(np.mean([res[0] for res in results]))
        assert loss != ref_loss, label
        assert_close_in_bf16(label, loss, results[0][1], ref_loss, ref_grads)


CONFIG = f"""\
name: simcse-raw-2w
method: simcse-unsup
model:
  name: {RAW_BERT}
data:
  train: sts-unlabeled
  max_train_samples: 1280
train:
  batch_size: 64
  lr: 1.0e-4
  max_steps: 20
  eval_every: 10
  log_every: 10
params:
  pooling: mean
resources:
  workers: 2
  cpus_per_worker: 0.5
  max_failures: 1
"""


@pytest.fixture(scope="module")
def two_worker_run(ray_cluster, tmp_path_factory):
    """`raysent train` on 2 workers, joining the session's Ray by RAY_ADDRESS."""
    tmp = tmp_path_factory.mktemp("two")
    (tmp / "exp.yaml").write_text(CONFIG)
    proc = run_cli("train", str(tmp / "exp.yaml"), "--output-dir", str(tmp / "run"), "--format", "json",
                   env={"RAY_ADDRESS": ray_cluster}, one_stream=True)
    # the CLI's JSON is a training summary as the library returns it
    return tmp, TrainSummary.model_validate(json_summary_last(proc.stdout, before="(RayTrainWorker"))


def test_raysent_train_on_two_workers_improves_the_raw_encoder(two_worker_run):
    tmp, summary = two_worker_run
    untuned, best = summary.initial_dev["dev_spearman"], summary.best_dev_spearman
    assert summary.workers == 2 and summary.final_step == 20
    assert best > untuned + 2, (untuned, best)
    assert (tmp / "run" / "best" / "config.json").is_file()
    ev = json.loads(cli_in_process("eval", "--model", str(tmp / "run" / "best"), "--split", "dev", "--format",
                                   "json").stdout)
    assert ev["dev_spearman"] == pytest.approx(best, abs=1e-6)


def wait_for(condition, seconds: float = 20.0) -> bool:
    deadline = time.time() + seconds
    while not condition():
        if time.time() > deadline:
            return False
        time.sleep(0.5)
    return True


def last_worker_dies_at_step_15(config: dict) -> None:
    """raysent's Ray Train worker loop, whose last worker raises before step 15 as a crashed worker would: once,
    in the run's first attempt (a replacement resumes from a checkpoint and goes on)."""
    import ray.train

    from raysent.train import loop, ray_train

    ctx = ray.train.get_context()
    if ctx.get_world_rank() == ctx.get_world_size() - 1 and ray.train.get_checkpoint() is None:
        step = loop.Stepper.step

        def step_or_die(self, batch, at):
            if at == 15:
                loop.Stepper.step = step  # once, should Ray run the replacement in this process
                raise RuntimeError(f"injected failure at step {at} (test of recovery)")
            return step(self, batch, at)

        loop.Stepper.step = step_or_die
    ray_train.train_worker(config)


def test_a_dying_worker_is_replaced_and_the_run_resumes_exactly(ray_cluster, tiny_bert, tmp_path, monkeypatch):
    import ray._private.state
    import ray.cloudpickle
    from safetensors.torch import load_file

    from raysent.train import ray_train
    from raysent.train.ray_train import train_with_ray

    # plumbing, not learning: the tiny random BERT, at a learning rate that moves its weights in every step, run
    # once whole and once with a worker dying at step 15
    (tmp_path / "exp.yaml").write_text(CONFIG.replace(RAW_BERT, tiny_bert).replace("lr: 1.0e-4", "lr: 1.0e-3"))
    base = load_config(tmp_path / "exp.yaml")
    uninterrupted = train_with_ray(with_overrides(base, {"train.output_dir": str(tmp_path / "whole")}), quiet=True)
    assert len({c.dev_spearman for c in uninterrupted.dev_curve}) == 3  # the dev score moves at every eval
    cfg = with_overrides(base, {"train.output_dir": str(tmp_path / "crash")})

    def controllers() -> set:
        # this session's Ray, from its GCS through this process's connection (with another Ray on the machine,
        # "the" Ray of `ray list actors` is ambiguous; and the tests' Ray runs no dashboard, which the state API
        # needs)
        return {aid for aid, a in ray._private.state.actors().items()
                if a["ActorClassName"] == "TrainController" and a["State"] == "ALIVE"}

    sigint, before = signal.getsignal(signal.SIGINT), controllers()
    # the workers cannot import this test module: the function goes to them by value
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with monkeypatch.context() as m:
        m.setattr(ray_train, "train_worker", last_worker_dies_at_step_15)
        summary = train_with_ray(cfg, quiet=True)
    # Ray Train's Ctrl-C handler for the run is gone with it, and with it the finished run's controller actor
    assert signal.getsignal(signal.SIGINT) is sigint
    assert wait_for(lambda: not controllers() - before), controllers()
    assert summary.resumed_at_step == 10  # replaced, and resumed from the step-10 checkpoint
    assert uninterrupted.resumed_at_step is uninterrupted.resumed_from is None
    # read where Ray keeps it in the run's folder (a copy per worker and restart would be a model and its
    # optimizer state of disk each, left behind by a worker that dies)
    ray_run = tmp_path / "crash" / "ray" / "run"
    assert Path(summary.resumed_from).is_relative_to(ray_run) and not list(ray_run.rglob(".restore-*"))
    assert summary.final_step == uninterrupted.final_step == 20
    assert summary.best_dev_spearman == pytest.approx(uninterrupted.best_dev_spearman, abs=1e-9)
    assert [c.dev_spearman for c in summary.dev_curve] == pytest.approx(
        [c.dev_spearman for c in uninterrupted.dev_curve], abs=1e-9)
    assert summary.best_step == uninterrupted.best_step
    whole, resumed = (load_file(Path(s.best_model_dir) / "model.safetensors") for s in (uninterrupted, summary))
    assert whole.keys() == resumed.keys() and all(torch.allclose(whole[k], resumed[k], atol=1e-6) for k in whole)
    # --resume of a run that has finished: nothing left to train, the same result and best model again
    first_final = Path(summary.ray["checkpoint"]) / "summary.json"
    before = first_final.read_text()
    again = train_with_ray(cfg, resume=True, quiet=True)
    assert again.resumed_at_step == again.final_step == 20
    assert again.resumed_from == summary.ray["checkpoint"]
    assert first_final.read_text() == before  # the checkpoint it was read from is left as it was
    assert again.best_dev_spearman == pytest.approx(summary.best_dev_spearman, abs=1e-9)
    assert (tmp_path / "crash" / "best" / "config.json").is_file()

    # what a search does with a trial the scheduler stopped: its best model out of its newest checkpoint, then
    # (as with every finished trial) the checkpoints deleted; nothing left to take after that
    from raysent.train.ray_train import delete_checkpoints, take_best_model_of_run

    shutil.rmtree(tmp_path / "crash" / "best")
    assert take_best_model_of_run(cfg)
    kept = json.loads((tmp_path / "crash" / "best" / "raysent.json").read_text())
    assert kept["dev_spearman"] == pytest.approx(again.best_dev_spearman, abs=1e-9)
    delete_checkpoints(cfg)
    assert not (tmp_path / "crash" / "ray").exists() and (tmp_path / "crash" / "best" / "model.safetensors").is_file()
    assert not take_best_model_of_run(cfg)


def test_workers_of_a_local_ray_train_at_the_drivers_priority(ray_cluster):
    """Ray starts workers at nice 15 unless told otherwise; the session's Ray is started by init_ray, whose
    RAY_worker_niceness=0 must reach the raylet, so training in a worker is not preempted by Ray's daemons."""
    import ray

    if os.environ.get("RAY_ADDRESS"):
        pytest.skip("the tests joined a Ray cluster (RAY_ADDRESS): its workers' niceness is the cluster's")
    nice = ray.remote(num_cpus=0.1)(lambda: os.nice(0))
    assert ray.get(nice.remote()) == os.nice(0) == 0


def test_a_local_ray_started_by_raysent_gets_its_train_settings_and_exported_values_win(monkeypatch):
    import ray

    from raysent.config import parse_config
    from raysent.train import ray_train

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "3")  # the user's value
    monkeypatch.delenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", raising=False)
    cfg = parse_config({"name": "t", "method": "simcse-unsup", "model": {"name": RAW_BERT}}, source="<test>")
    ray_train.init_ray(cfg, num_cpus=3)
    assert calls == [{"dashboard_host": "127.0.0.1", "log_to_driver": True, "num_cpus": 3}]
    assert os.environ["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "3"
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
    assert os.environ["RAY_worker_niceness"] == "0"  # noqa: SIM112 - Ray's own spelling
    # a cluster is joined as it is: no local settings, no local arguments
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    monkeypatch.delenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER")
    ray_train.init_ray(cfg, num_cpus=3)
    assert calls[-1] == {"address": "auto", "log_to_driver": True}
    assert "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER" not in os.environ

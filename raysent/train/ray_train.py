"""Ray Train: the one-worker loop of raysent.train.loop on N workers (Train V2 ``TorchTrainer``).

The train function of every worker is :func:`raysent.train.run.train_once`, as in process, with
:class:`RayHooks` instead of the in-process hooks:

* DDP through ``ray.train.torch.prepare_model`` (gloo on CPU, NCCL on GPU), with what a method keeps
  local to each worker (SG's frozen BERT_F: ``Method.ddp_ignored``) left out of DDP;
* global negatives through :class:`raysent.train.gather.DistributedGatherer` (all-gather with
  gradient), or local negatives only when ``train.gather_negatives`` is false;
* STS-B dev on rank 0 only, its scores broadcast, so the best checkpoint is chosen once;
* checkpoints (model, optimizer, scheduler, step, every worker's RNG state, best dev score and the
  best model) reported with ``ray.train.report(…, checkpoint=Checkpoint)``; a replacement worker
  resumes from ``ray.train.get_checkpoint()``; ``FailureConfig(max_failures)`` from the config;
* storage under ``<output_dir>/ray`` by default, or any pyarrow/fsspec URI (s3://, gs://, an NFS
  folder) from ``resources.storage_path``.

At the end the driver copies the best model out of the final checkpoint into ``<output_dir>/best``
and writes ``<output_dir>/result.json``, as a one-worker run does.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from raysent.config import ExperimentConfig, parse_config, with_overrides
from raysent.errors import RaysentError
from raysent.io import write_json_atomic
from raysent.methods import Gatherer, Method
from raysent.orphans import note_local_ray, stop_orphaned_local_ray
from raysent.train import compile_cache
from raysent.train import run as in_process
from raysent.train.gather import DistributedGatherer
from raysent.train.loop import BEST_DIR, STATE_FILE, TrainHooks, format_eval, link_tree
from raysent.train.records import TrainSummary, read_summary
from raysent.train.resources import HIDE_ON_ZERO, cap_memory, claim_devices, resolve, resolved, train_worker_resources
from raysent.train.run import finish, stage_dirs, stderr, train_once, train_stages

# Lazy imports: pyarrow, ray (heavy, and only the functions that need them import them).

SUMMARY_FILE = "summary.json"
# environment a worker needs to find data and models (absolute paths from the driver)
FORWARDED_ENV = ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR", "RAYSENT_CACHE_DIR", "HF_HOME", "HF_HUB_CACHE",
                 "HF_DATASETS_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE",
                 *compile_cache.VARS)  # the search's compiler caches (raysent.train.compile_cache)


# --------------------------------------------------------------------------- worker side
class RayHooks(TrainHooks):
    """The loop's hooks on a Ray Train worker."""

    def __init__(self, cfg: ExperimentConfig, quiet: bool = False):
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        self.rank, self.world_size = ctx.get_world_rank(), ctx.get_world_size()
        self.quiet = quiet
        self.resume = True  # whatever Ray hands us (a retry, or a resumed run) is resumed
        # no output folder of its own (the base's output_dir): its checkpoints are Ray's (restore_dir, scratch_dir,
        # report and finish are this class's)
        self.device = ray.train.torch.get_device()
        self.gather_negatives = cfg.train.gather_negatives
        self._scratch: Path | None = None
        self._last: Path | None = None
        self._copy: Path | None = None  # a downloaded copy of the checkpoint resumed from (remote storage)
        # on a local (or NFS) storage path, checkpoints are written straight into Ray's experiment folder and
        # reported without an upload (no copy of model + optimizer at every evaluation); elsewhere (s3://, gs://)
        # they are written to a temporary folder and uploaded by Ray
        self._in_storage: Path | None = None
        try:
            import pyarrow.fs as pafs

            storage = ray.train.get_context().get_storage()
            if isinstance(storage.storage_filesystem, pafs.LocalFileSystem):
                self._in_storage = Path(storage.experiment_fs_path)
        except Exception:  # another Ray version: upload as before
            self._in_storage = None

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def gatherer(self) -> Gatherer:
        if self.distributed and self.gather_negatives:
            return DistributedGatherer()
        return Gatherer()  # local negatives: this worker's rows and columns only

    def wrap(self, method: Method, ddp: bool = True) -> torch.nn.Module:
        if not self.distributed:
            return method
        if not ddp:  # gradients averaged by sync_gradients; start from rank 0's weights, as DDP would
            with torch.no_grad():
                for p in method.parameters():
                    dist.broadcast(p.data, src=0)
            return method
        from ray.train.torch import prepare_model

        ignored = method.ddp_ignored()
        if ignored:
            DDP._set_params_and_buffers_to_ignore_for_model(method, ignored)
        # unused parameters are normal here (e.g. BERT's pooler under cls_before_pooler pooling)
        return prepare_model(method, move_to_device=False,
                             parallel_strategy_kwargs={"find_unused_parameters": True})

    def sync_gradients(self, method: Method) -> None:
        if not self.distributed:
            return
        for p in method.trainable_parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)

    def broadcast(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_object(self, obj: Any) -> list:
        if not self.distributed:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def mean_across(self, value: float) -> float:
        if not self.distributed:
            return value
        dev = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        t = torch.tensor([value], dtype=torch.float64, device=dev)
        dist.all_reduce(t)
        return float(t.item()) / self.world_size

    def restore_dir(self) -> Path | None:
        import ray.train

        ckpt = ray.train.get_checkpoint()
        if ckpt is None:
            return None
        if self._in_storage is not None and Path(ckpt.path).is_dir():
            # a checkpoint in the experiment folder on this file system is read where Ray keeps it: a copy would
            # cost a model plus optimizer of disk per worker and per restart (and outlive a worker that dies)
            local = Path(ckpt.path)
        else:
            local = Path(tempfile.mkdtemp(dir=self.scratch_dir(), prefix=".restore-"))
            ckpt.to_directory(str(local))
            self._copy = local
        if not (local / STATE_FILE).is_file():
            self._drop_copy()
            return None
        self.restored_from = ckpt.path
        # the newest checkpoint until this worker reports one: a resumed run with nothing left to train
        # builds its final checkpoint (state and best model) from it
        self._last = local
        return local

    def _drop_copy(self) -> None:
        """Delete this worker's downloaded copy of the checkpoint it resumed from."""
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            if self._last == self._copy:
                self._last = None
            self._copy = None

    def scratch_dir(self) -> Path:
        if self._scratch is None:
            if self._in_storage is not None:
                self._in_storage.mkdir(parents=True, exist_ok=True)
                self._scratch = Path(tempfile.mkdtemp(dir=self._in_storage, prefix=".raysent-worker-"))
            else:
                self._scratch = Path(tempfile.mkdtemp(prefix="raysent-worker-"))
        return self._scratch

    def report(self, metrics: dict, checkpoint_dir: Path | None) -> None:
        import ray.train

        clean = {k: v for k, v in metrics.items() if v is not None}
        if checkpoint_dir is not None:
            checkpoint = ray.train.Checkpoint.from_directory(str(checkpoint_dir))
            if self._in_storage is not None and Path(checkpoint_dir).is_relative_to(self._in_storage):
                # already in Ray's experiment folder: registered where it is; Ray's num_to_keep deletes old ones
                ray.train.report(clean, checkpoint=checkpoint,
                                 checkpoint_upload_mode=ray.train.CheckpointUploadMode.NO_UPLOAD)
            else:
                ray.train.report(clean, checkpoint=checkpoint)
                if self._last is not None and self._last != self._copy:  # uploaded by Ray: this copy is done
                    shutil.rmtree(self._last, ignore_errors=True)
            self._drop_copy()  # no longer the newest (the final checkpoint is built from the newest)
            self._last = Path(checkpoint_dir)
        else:
            ray.train.report(clean)
            if self.rank != 0:  # only rank 0 writes checkpoints: other workers need their copy only to load it
                self._drop_copy()
        if "dev_spearman" in metrics and not metrics.get("finished"):
            self.log(format_eval(metrics))

    def log(self, msg: str) -> None:
        # Train V2 patches print() into its own logger (which echoes twice): write to stderr directly
        if self.rank == 0 and not self.quiet:
            sys.stderr.write(msg + "\n")
            sys.stderr.flush()

    def finish(self, metrics: dict, summary: TrainSummary) -> None:
        """The final checkpoint: the newest state and best model, plus the run summary."""
        final = None
        if self.rank == 0:
            final = Path(tempfile.mkdtemp(dir=self.scratch_dir(), prefix=".final-")) / "checkpoint"
            if self._last is not None:
                link_tree(self._last, final)
            final.mkdir(exist_ok=True)
            # a new file, not a write through a link: the newest checkpoint may be Ray's final one of the run
            # this run resumed, whose summary must stay as it was
            write_json_atomic(final / SUMMARY_FILE, summary.to_json())
        self.report({**metrics, "finished": True}, final)
        if self._scratch is not None:
            if self._in_storage is not None and self.rank == 0:  # its checkpoints are Ray's now; the rest goes
                shutil.rmtree(self._scratch / BEST_DIR, ignore_errors=True)
            else:
                shutil.rmtree(self._scratch, ignore_errors=True)


def train_worker(config: dict) -> None:
    """The train function of every Ray Train worker (:func:`make_trainer`'s): :func:`raysent.train.run.train_once`,
    as in process, with :class:`RayHooks`."""
    entered = time.time()
    device = claim_devices()  # given no GPU, it sees none (before anything below touches CUDA)
    for key, value in config.get("env", {}).items():
        # a node with its own copy of the data (cluster setup) keeps it; paths that exist here win
        if key not in compile_cache.VARS and (key not in os.environ or not key.endswith("_DIR")
                                              or os.path.exists(value)):
            os.environ[key] = value
    compile_cache.take(config.get("env", {}))
    # Ray Train's per-report INFO lines would drown the progress lines; the module that writes them names
    # its logger by its file path, not by its module, so "ray.train" alone does not cover it
    names = ["ray.train"]
    try:
        from ray.train.v2._internal.execution import context as _train_context

        names.append(_train_context.__file__)
    except ImportError:  # another Ray version: its lines stay
        pass
    for name in names:
        logging.getLogger(name).setLevel(logging.WARNING)
    cfg = parse_config(config["config"], source="<ray worker config>")
    if cfg.resources.gpus_per_worker != "auto":  # make_trainer resolved it
        cap_memory(device, float(cfg.resources.gpus_per_worker))  # one worker on a share of a GPU: at most its memory
    train_once(cfg, RayHooks(cfg, quiet=config.get("quiet", False)), startup={"entered_unix": entered})


# --------------------------------------------------------------------------- driver side
# Settings of a Ray that raysent starts on this machine, set in the environment its processes inherit (a value the
# user exported wins; a cluster you join keeps its own). Measurements: docs/performance.md, "Measured", Ray.
# * RAY_worker_niceness=0: the training loop runs in a Ray worker, which Ray starts at nice 15, so every wake-up
#   of Ray's daemons preempted one torch thread and stalled the other. A worker cannot renice itself (that needs
#   CAP_SYS_NICE), so it is set before the raylet starts.
# * Train's controller polls its workers every 0.5 s instead of 2 s: a finished or failed worker is noticed sooner.
# * no spot-preemption watcher actor: a local machine is not preempted, and every idle Ray process takes CPU.
# * RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1: a process that asked for no GPU is hidden from the GPUs again, as before
#   Ray 2.5x (raysent.train.resources: resources are claimed, never borrowed).
LOCAL_RAY_ENV = {"RAY_worker_niceness": "0", "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.5",
                 "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", **HIDE_ON_ZERO}


def init_ray(cfg: ExperimentConfig, log_to_driver: bool = True, **local) -> None:
    """Connect to ``resources.address`` (or RAY_ADDRESS), else start a local Ray (dashboard on 127.0.0.1;
    ``local``: more ``ray.init`` arguments for that case, e.g. ``num_cpus``)."""
    import ray

    if ray.is_initialized():
        return
    address = cfg.resources.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=log_to_driver)
    else:
        stop_orphaned_local_ray(say=lambda m: print(m, file=sys.stderr, flush=True))
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)
        context = ray.init(dashboard_host="127.0.0.1", log_to_driver=log_to_driver, **local)
        session = (getattr(context, "address_info", None) or {}).get("session_dir")
        if session:
            note_local_ray(session)  # stopped by the next raysent if this one is killed


def run_location(cfg: ExperimentConfig) -> tuple[str, str]:
    """(storage_path, run name) of one training run: <output_dir>/ray by default."""
    out = cfg.output_dir().resolve()
    if cfg.resources.storage_path:
        digest = hashlib.sha1(str(out).encode()).hexdigest()[:8]
        root = cfg.resources.storage_path
        root = root if "://" in root else str(Path(root).expanduser().resolve())  # workers run elsewhere
        return root, f"{cfg.name}-{out.name}-{digest}"
    return str(out / "ray"), "run"


def delete_run(storage_path: str, name: str) -> None:
    """Delete a run's folder in Ray's storage: a fresh (not resumed) run must not pick up an earlier run's
    checkpoints, and a search deletes a finished trial's (``search.keep_checkpoints``)."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(storage_path if "://" in storage_path else
                                        Path(storage_path).resolve().as_uri())
    path = f"{root.rstrip('/')}/{name}"
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        fs.delete_dir(path)


def delete_checkpoints(cfg: ExperimentConfig) -> None:
    """Delete a finished run's resume checkpoints of every stage, in this process's folders and, for a run
    on Ray Train workers, its run folder in Ray's storage (which may be remote). Best models and
    result.json stay."""
    in_process.delete_checkpoints(cfg)
    if not cfg.resources.workers:
        return
    for stage_out in stage_dirs(cfg):
        delete_run(*run_location(with_overrides(cfg, {"train.output_dir": str(stage_out)})))
        try:
            (stage_out / "ray").rmdir()  # the default storage folder, now empty
        except OSError:
            pass


def worker_env() -> dict[str, str]:
    env = {}
    for key in FORWARDED_ENV:
        if key in os.environ:
            v = os.environ[key]
            env[key] = str(Path(v).resolve()) if key.endswith(("_DIR", "_HOME", "_CACHE")) else v
    return env


def make_trainer(cfg: ExperimentConfig, resume: bool = False, quiet: bool = False, callbacks: list | None = None):
    """The TorchTrainer of one training run of ``cfg`` (also used inside a Tune trial)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    cfg = resolved(cfg)  # a number already when the driver resolved it (raysent tune, raysent train)
    r = cfg.resources
    workers = r.workers or 1
    if cfg.train.batch_size % workers:
        raise RaysentError(f"train.batch_size {cfg.train.batch_size} does not split evenly over "
                           f"resources.workers={workers}; use a multiple of {workers}")
    use_gpu, per_worker = train_worker_resources(cfg)
    storage, name = run_location(cfg)
    if not resume:
        delete_run(storage, name)
    loop_config = {"config": cfg.to_dict(), "quiet": quiet, "env": worker_env()}
    return TorchTrainer(
        train_worker,
        train_loop_config=loop_config,
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=use_gpu, resources_per_worker=per_worker),
        run_config=RunConfig(name=name, storage_path=storage, callbacks=callbacks,
                             failure_config=FailureConfig(max_failures=r.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
    )


def take_best_model(checkpoint, out: Path) -> TrainSummary | None:
    """Put the best model of a Ray Train checkpoint in <out>/best (replaced atomically; hard links where the
    checkpoint is on this file system); returns the run summary the checkpoint holds (the final one has it)."""
    out.mkdir(parents=True, exist_ok=True)
    with checkpoint.as_directory() as d:
        d = Path(d)
        if not (d / BEST_DIR).is_dir():
            raise RaysentError(f"checkpoint {checkpoint.path} holds no best model")
        tmp = Path(tempfile.mkdtemp(dir=out, prefix=".best-"))
        shutil.rmtree(tmp)
        link_tree(d / BEST_DIR, tmp)
        summary = read_summary(d / SUMMARY_FILE) if (d / SUMMARY_FILE).is_file() else None
    shutil.rmtree(out / BEST_DIR, ignore_errors=True)
    tmp.rename(out / BEST_DIR)
    return summary


def collect(cfg: ExperimentConfig, result, t0: float) -> TrainSummary:
    """Copy the best model out of the final checkpoint, write result.json, return the summary."""
    if result.error is not None:
        raise RaysentError(f"training {cfg.name} failed on Ray Train: {result.error}")
    if result.checkpoint is None:
        raise RaysentError(f"training {cfg.name} on Ray Train reported no checkpoint")
    out = cfg.output_dir().resolve()
    summary = take_best_model(result.checkpoint, out)
    if summary is None:
        raise RaysentError(f"training {cfg.name} on Ray Train: its last checkpoint has no run summary")
    summary.ray = {"storage_path": result.path, "checkpoint": result.checkpoint.path}
    return finish(cfg, summary, out, t0)


def take_best_model_of_run(cfg: ExperimentConfig) -> bool:
    """The best model of an unfinished Ray Train run of ``cfg`` (a trial the scheduler stopped) from the newest
    checkpoint in Ray's storage into <output_dir>/best; False when this machine cannot read one."""
    from ray.train import Result

    storage, name = run_location(cfg)
    try:
        result = Result.from_path(f"{storage.rstrip('/')}/{name}")
    except RuntimeError:  # no such run folder, or no checkpoint registered yet
        return False
    if result.checkpoint is None:
        return False
    take_best_model(result.checkpoint, cfg.output_dir().resolve())
    return True


def train_one_with_ray(cfg: ExperimentConfig, resume: bool = False, quiet: bool = False,
                       callbacks: list | None = None) -> TrainSummary:
    from ray.train import TrainingFailedError

    t0 = time.time()
    cfg = resolved(cfg)  # its result.json records the number
    trainer = make_trainer(cfg, resume=resume, quiet=quiet, callbacks=callbacks)
    # fit() in the main thread installs a Ctrl-C handler that aborts its run, and leaves it installed: it would
    # swallow a later Ctrl-C and keep the finished run's controller actor alive (polling) for as long as the
    # process lives. The handler from before comes back once fit() returns.
    main = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if main else None
    try:
        result = trainer.fit()
    except TrainingFailedError as e:
        raise RaysentError(f"training {cfg.name} failed on Ray Train (after "
                           f"resources.max_failures={cfg.resources.max_failures} retries): {e}") from e
    finally:
        if sigint is not None:  # None also when the handler was not set from Python: leave it then
            signal.signal(signal.SIGINT, sigint)
    return collect(cfg, result, t0)


def train_with_ray(cfg: ExperimentConfig, resume: bool = False, quiet: bool = False) -> TrainSummary:
    """`raysent train` with resources.workers: every stage of the method through Ray Train."""
    init_ray(cfg)
    cfg, place = resolve(cfg)  # resources.gpus_per_worker auto, once: its number is in every stage's result.json
    if not quiet:
        stderr(f"resources.gpus_per_worker {place.gpus()}: the run trains on {place.device}")
    return train_stages(cfg, lambda c: train_one_with_ray(c, resume, quiet), resume=resume,
                        log=(lambda m: None) if quiet else stderr)

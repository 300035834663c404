"""The GPUs and CPUs a run claims from Ray, and the devices its trials and workers may use.

Resources are claimed, never borrowed (DESIGN.md, "Conventions"): a trial trains on the GPUs Ray gave it and on
no other.

``resources.gpus_per_worker: auto``
    The default: 1 when the Ray cluster has GPUs or can start nodes that have them, else 0. The driver resolves it
    once, when it has joined or started Ray (:func:`resolve`), logs the line :meth:`Placement.describe` gives,
    and hands the trials the number (their configs, and so their run records and ``result.json``, hold it). A
    fraction shares a GPU: 0.25 runs four trials on each GPU (Tune places them by the ``GPU`` resource they ask
    for, :func:`tune_trial_resources`).
Many trials per GPU (:mod:`raysent.train.packing`)
    A search's trials that train in their own process (``resources.workers: null``) are packed under ``auto``:
    ``raysent tune`` measures the trial's own training step on one GPU at 1, 2, 4, ... copies at once
    (:mod:`raysent.tune.gpu_probe`, once per search, cached in the experiment's folder) and passes the choice to
    :func:`resolve` (``packing``): ``k`` trials per GPU ask for ``1/k`` GPU each. Without a CUDA device to measure
    on, or for Ray Train trials (their workers form an NCCL group, which cannot share a GPU), auto stays 1 per GPU.
    A number given in the config wins. A process given a share of a GPU (below 1, given or chosen) caps its memory
    at that share of what :data:`raysent.train.packing.HEADROOM` leaves (:func:`cap_memory`). Every run record keeps
    what its trial was given (:func:`run_record`).
``search.max_concurrent_trials: auto``
    The default: as many trials as the cluster holds (its GPUs, or CPUs for CPU trials, over what one trial asks
    for), the nodes its autoscaler can start included; a number caps it (:func:`concurrency`).
What an autoscaling cluster can start (:func:`cluster_capacity`)
    ``clusters/gpu.yaml`` starts with a CPU head alone and adds GPU nodes when trials ask for GPUs, so the GPUs
    alive when a search starts are none. Counted, in order: the cluster config Ray's autoscaler reports to the GCS
    (``ray._private.state.state.get_max_resources_from_cluster_config()``, what Ray Train V2 checks a worker group
    against: the v2 autoscaler and KubeRay report it); else the autoscaler's own config file (``available_node_types``
    and ``max_workers``): ``RAYSENT_AUTOSCALING_CONFIG``, or the ``--autoscaling-config`` of the cluster's autoscaler
    process on this machine (the head: ``ray up`` runs it on ``~/ray_bootstrap_config.yaml``); else what is alive.
A trial or worker that asked for no GPU sees none
    Since Ray 2.5x a task or actor that asks for no GPU is no longer hidden from the GPUs (ray-project/ray#54868;
    ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`` restores the hiding). So a trial that asked for none would find every
    GPU of its node and train on GPU 0 (``torch.cuda.is_available()``), which Ray does not know is in use.
    :func:`claim_devices` runs first in every Tune trial (:func:`raysent.tune.trial.prepare_process`) and every
    Ray Train worker (:func:`raysent.train.ray_train.train_worker`): given no GPU, it sets
    ``CUDA_VISIBLE_DEVICES=""`` before torch touches CUDA, so the loop's default device
    (:func:`raysent.train.device.default_device`) is the CPU; and it returns the device the process trains on,
    which the trial's hooks use whatever torch saw before. A Ray that raysent starts also gets
    ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`` (:data:`HIDE_ON_ZERO`), so Ray itself hides the GPUs from such a
    process as it starts it (Ray Train's worker setup asks torch about CUDA before the train function runs).

Imports Ray only inside the functions that need it.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

import torch

from raysent.config import ExperimentConfig, with_overrides
from raysent.train.packing import Packing, memory_fraction, trials_per_gpu

VISIBLE = "CUDA_VISIBLE_DEVICES"
# set in the environment of a Ray that raysent starts (raysent.train.ray_train.LOCAL_RAY_ENV)
HIDE_ON_ZERO = {"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}
EPS = 1e-9


AUTOSCALING_CONFIG_VAR = "RAYSENT_AUTOSCALING_CONFIG"


def capacity_of_config(config: dict[str, Any]) -> dict[str, float]:
    """CPUs and GPUs an autoscaler config (``ray up``'s YAML) can run at most: the head's once, each worker type's
    times its ``max_workers``, the whole within the cluster's ``max_workers`` worker nodes (counted for each resource
    with the nodes that have most of it)."""
    types = config.get("available_node_types") or {}
    head = config.get("head_node_type")
    cap = config.get("max_workers")
    out: dict[str, float] = {}
    for key in ("CPU", "GPU"):
        total = float((types.get(head, {}).get("resources") or {}).get(key, 0)) if head in types else 0.0
        nodes = sorted(((float((t.get("resources") or {}).get(key, 0)), int(t.get("max_workers", 0) or 0))
                        for name, t in types.items() if name != head), reverse=True)
        left = int(cap) if cap is not None else sum(n for _, n in nodes)
        for per, n in nodes:
            take = min(n, left)
            total += per * take
            left -= take
        out[key] = total
    return out


def autoscaler_config_path(gcs_address: str | None) -> str | None:
    """The autoscaler config of the cluster at ``gcs_address``: ``RAYSENT_AUTOSCALING_CONFIG``, else the
    ``--autoscaling-config`` of that cluster's autoscaler (Ray's monitor process) when it runs on this machine."""
    if os.environ.get(AUTOSCALING_CONFIG_VAR):
        return os.environ[AUTOSCALING_CONFIG_VAR]
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if not any(part.endswith("monitor.py") for part in cmd):
            continue
        if gcs_address and not any(part == f"--gcs-address={gcs_address}" for part in cmd):
            continue
        for i, part in enumerate(cmd):
            if part.startswith("--autoscaling-config="):
                return os.path.expanduser(part.split("=", 1)[1])
            if part == "--autoscaling-config" and i + 1 < len(cmd):
                return os.path.expanduser(cmd[i + 1])
    return None


def autoscaler_capacity(gcs_address: str | None) -> tuple[dict[str, float], str] | None:
    """CPUs and GPUs the connected cluster's autoscaler can start, and where that was read (see the module)."""
    import ray

    try:
        reported = ray._private.state.state.get_max_resources_from_cluster_config()
    except Exception:  # an older or a client-mode Ray: no such state
        reported = None
    if reported:
        return ({"CPU": float(reported.get("CPU", 0)), "GPU": float(reported.get("GPU", 0))},
                "the cluster config its autoscaler reports")
    path = autoscaler_config_path(gcs_address)
    if path and os.path.isfile(path):
        import yaml

        with open(path, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
        return capacity_of_config(config), f"node types of {path}"
    return None


def auto_gpus(cluster_gpus: float) -> float:
    """``gpus_per_worker: auto`` on a cluster with ``cluster_gpus`` GPUs: 1 when it has any, else 0."""
    return 1.0 if cluster_gpus > 0 else 0.0


def packable(cfg: ExperimentConfig) -> bool:
    """Whether ``auto`` may pack ``cfg``'s trials onto a GPU: ``gpus_per_worker: auto`` and trials that train in their
    own process (Ray Train's workers form an NCCL group, which cannot hold two workers on one GPU)."""
    return cfg.resources.gpus_per_worker == "auto" and not cfg.resources.workers


def gpus_per_worker(cfg: ExperimentConfig, cluster_gpus: float | None, packing: Packing | None = None) -> float | None:
    """``resources.gpus_per_worker`` as a number (``auto`` resolved against ``cluster_gpus``, and ``packing``'s share
    when it packs; None when it is ``auto`` and the cluster's GPUs are not known)."""
    value = cfg.resources.gpus_per_worker
    if value == "auto":
        if cluster_gpus is None:
            return None
        gpus = auto_gpus(cluster_gpus)
        return packing.gpus_per_worker if packing is not None and gpus == 1 and packable(cfg) else gpus
    return float(value)


def concrete(cfg: ExperimentConfig) -> float:
    """``resources.gpus_per_worker`` of a config whose ``auto`` was resolved (:func:`resolve`)."""
    value = cfg.resources.gpus_per_worker
    if value == "auto":
        raise RuntimeError("resources.gpus_per_worker is still 'auto': resolve(cfg, ...) first")
    return float(value)


def tune_trial_resources(cfg: ExperimentConfig) -> dict[str, float]:
    """What one Tune trial's own process asks for (``tune.with_resources``): its driver's CPUs when it trains on
    Ray Train workers (they ask for their own, :func:`train_worker_resources`), else the CPUs and GPUs it trains
    with."""
    r = cfg.resources
    if r.workers:
        return {"CPU": r.trial_cpus}
    return {"CPU": r.cpus_per_worker, "GPU": concrete(cfg)}


def train_worker_resources(cfg: ExperimentConfig) -> tuple[bool, dict[str, float]]:
    """(use_gpu, resources_per_worker) of each Ray Train worker (``ScalingConfig``)."""
    gpus = concrete(cfg)
    return gpus > 0, {"CPU": cfg.resources.cpus_per_worker, **({"GPU": gpus} if gpus > 0 else {})}


def run_resources(cfg: ExperimentConfig, gpus: float) -> dict[str, float]:
    """What one run (one Tune trial) holds in all, with ``gpus`` per worker."""
    r = cfg.resources
    if r.workers:
        return {"CPU": r.trial_cpus + r.workers * r.cpus_per_worker, "GPU": r.workers * gpus}
    return {"CPU": r.cpus_per_worker, "GPU": gpus}


@dataclass(frozen=True)
class Placement:
    """Where a run's trials train and how many run at once, on a cluster of ``cluster`` CPUs and GPUs."""

    gpus_per_worker: float | None  # None: auto, against a cluster not known yet
    auto: bool  # the config said auto
    cluster: dict[str, float] | None  # CPU and GPU of the Ray cluster (or of this machine, for a local Ray)
    where: str  # where ``cluster`` was read ("the Ray cluster", "this machine")
    per_trial: dict[str, float] | None  # what one trial holds in all
    device: str  # what each trial (each of its workers) trains on
    at_once: int | None  # trials that run at once
    limit: str  # what sets at_once
    trials_per_gpu: int | None = None  # trials that share one GPU (0: they train on the CPU; None: not known yet)
    packing: dict[str, Any] | None = None  # how auto chose trials_per_gpu (Packing.record), when it measured
    packs: bool = False  # auto may pack these trials onto a GPU (packable, on a cluster with GPUs)

    def gpus(self) -> str:
        """``resources.gpus_per_worker`` as the run uses it, and why when it was ``auto``."""
        if self.gpus_per_worker is None:
            return ("auto: 1 if the Ray cluster has GPUs, or its autoscaler can start nodes with GPUs, else 0; "
                    "trials in their own process are packed onto a GPU when a probe on it measures that packing "
                    "trains faster")
        if not self.auto or self.cluster is None:
            return f"{self.gpus_per_worker:g}"
        have = self.cluster.get("GPU", 0.0)
        if have and self.packing is not None:
            return f"{self.gpus_per_worker:g} (auto: {self.packing['reason']})"
        if have and self.packs:
            return (f"{self.gpus_per_worker:g} (auto: {self.where} has {have:g} GPU(s); how many trials share one is "
                    "measured on a GPU when the search starts)")
        if have:
            return f"{self.gpus_per_worker:g} (auto: {self.where} has {have:g} GPU(s))"
        grows = ("; if it adds GPU nodes that its autoscaler does not declare, give the number: "
                 "resources.gpus_per_worker: 1 (or RAYSENT_AUTOSCALING_CONFIG=its YAML)"
                 ) if self.where.startswith("the Ray cluster") else ""
        return f"{self.gpus_per_worker:g} (auto: {self.where} has no GPU{grows})"

    def describe(self) -> str:
        """One line for the log."""
        per_gpu = f"; {self.trials_per_gpu} trial(s) per GPU" if self.trials_per_gpu else ""
        at_once = f"; {self.at_once} trial(s) at once ({self.limit})" if self.at_once is not None else ""
        return f"resources.gpus_per_worker {self.gpus()}: each trial trains on {self.device}{per_gpu}{at_once}"

    def record(self) -> dict[str, Any]:
        return asdict(self)


def trial_device(cfg: ExperimentConfig, gpus: float | None) -> str:
    """What each trial of ``cfg`` trains on with ``gpus`` per worker, in words."""
    w = cfg.resources.workers
    where = f" on each of its {w} Ray Train worker(s)" if w else " in its own process"
    if gpus is None:
        return "cuda or the CPU (gpus_per_worker auto: not known until the run joins the cluster)"
    if gpus == 0:
        return f"the CPU{where} (it asks for no GPU and sees none)"
    if gpus < 1:
        fraction = memory_fraction(gpus)
        share = (f"{gpus:g} of a GPU, shared with {trials_per_gpu(gpus) - 1} other trial(s), its memory capped at "
                 f"{fraction:.1%} of the GPU's")
    else:
        share = f"{gpus:g} GPU(s)" + (" (it trains on the first)" if gpus > 1 and not w else "")
    return f"cuda{where}: {share}" + (" (NCCL)" if w else "")


def concurrency(cfg: ExperimentConfig, cluster: dict[str, float], gpus: float,
                trials: int | None = None) -> tuple[int, str]:
    """(trials at once, what sets it): ``search.max_concurrent_trials`` (1 without a search), the phase's
    ``trials``, and how many trials the cluster's CPUs and GPUs hold at once (each needs its whole share on one
    cluster; nodes may hold fewer)."""
    need = run_resources(cfg, gpus)
    asked = cfg.search.max_concurrent_trials if cfg.search else 1
    limits: list[tuple[int, str]] = [] if asked == "auto" else [(int(asked), "search.max_concurrent_trials")]
    if trials is not None:
        limits.append((trials, "trials in the phase"))
    for key in ("CPU", "GPU"):
        if need[key] > 0:
            fits = math.floor(cluster.get(key, 0.0) / need[key] + EPS)
            limits.append((fits, f"{'auto: ' if asked == 'auto' else ''}{cluster.get(key, 0.0):g} {key}s / "
                                 f"{need[key]:g} per trial"))
    n, why = min(limits, key=lambda x: x[0])
    return max(n, 1), why


def placement(cfg: ExperimentConfig, cluster: dict[str, float] | None, where: str,
              trials: int | None = None, packing: Packing | None = None) -> Placement:
    """Where ``cfg``'s trials train, how many share a GPU and how many run at once on ``cluster`` (None: not known
    yet); ``packing``: what the GPU probe chose for ``auto`` (:mod:`raysent.tune.gpu_probe`; a number in the config
    wins)."""
    gpus = gpus_per_worker(cfg, None if cluster is None else cluster.get("GPU", 0.0), packing)
    auto = cfg.resources.gpus_per_worker == "auto"
    packs = bool(packable(cfg) and gpus)
    packed = packing.record() if packing is not None and packs else None
    per_gpu = None if gpus is None else trials_per_gpu(gpus)
    if gpus is None or cluster is None:
        return Placement(gpus, auto, cluster, where, None if gpus is None else run_resources(cfg, gpus),
                         trial_device(cfg, gpus), None, "the cluster is not known yet", per_gpu, packed, packs)
    at_once, limit = concurrency(cfg, cluster, gpus, trials)
    return Placement(gpus, auto, cluster, where, run_resources(cfg, gpus), trial_device(cfg, gpus), at_once, limit,
                     per_gpu, packed, packs)


def cluster_capacity() -> tuple[dict[str, float], str] | None:
    """(CPU and GPU, where it was read) of the Ray cluster this process is connected to: what is alive, or, when its
    autoscaler can start more, that (each resource the larger); None when not connected."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    res = ray.cluster_resources()
    now = {"CPU": float(res.get("CPU", 0)), "GPU": float(res.get("GPU", 0))}
    try:
        gcs = ray.get_runtime_context().gcs_address
    except Exception:
        gcs = None
    grows = autoscaler_capacity(gcs)
    if grows is None or all(grows[0][k] <= now[k] for k in now):
        return now, "the Ray cluster"
    return ({k: max(now[k], grows[0][k]) for k in now},
            f"the Ray cluster with the nodes its autoscaler can add ({grows[1]}; alive now: {now['CPU']:g} CPUs, "
            f"{now['GPU']:g} GPUs)")


def this_machine() -> dict[str, float]:
    """CPU and GPU of this machine: what a local Ray started here would have."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"CPU": float(os.cpu_count() or 1), "GPU": float(gpus)}


def resolve(cfg: ExperimentConfig, cluster: dict[str, float] | None = None,
            where: str = "the Ray cluster", trials: int | None = None,
            packing: Packing | None = None) -> tuple[ExperimentConfig, Placement]:
    """``cfg`` with ``resources.gpus_per_worker`` a number, and its :class:`Placement`. ``cluster``: the CPUs
    and GPUs to resolve against (default: the Ray this process is connected to, else this machine); ``packing``:
    the trials per GPU ``auto`` chose (:mod:`raysent.tune.gpu_probe`; without it, auto is 1 per GPU)."""
    if cluster is None:
        found = cluster_capacity()
        cluster, where = found if found is not None else (this_machine(), "this machine")
    place = placement(cfg, cluster, where, trials, packing)
    if cfg.resources.gpus_per_worker == "auto":
        cfg = with_overrides(cfg, {"resources.gpus_per_worker": place.gpus_per_worker})
    if cfg.search is not None and cfg.search.max_concurrent_trials == "auto":
        cfg = with_overrides(cfg, {"search.max_concurrent_trials": concurrency(cfg, cluster, concrete(cfg))[0]})
    return cfg, place


def run_record(cfg: ExperimentConfig, place: dict[str, Any] | None, trials: int | None) -> dict[str, Any]:
    """What every run record of a phase of ``trials`` trials keeps of its resources: the GPUs each trial asked for,
    the trials per GPU and at once, the memory cap of a trial that shares a GPU, and how ``auto`` chose (``place``:
    the search's :meth:`Placement.record`)."""
    gpus = concrete(cfg)
    cluster = (place or {}).get("cluster")
    at_once = (concurrency(cfg, cluster, gpus, trials)[0] if cluster else
               min(trials_at_once(cfg), trials) if trials is not None else trials_at_once(cfg))
    out: dict[str, Any] = {"gpus_per_worker": gpus, "trials_per_gpu": trials_per_gpu(gpus), "trials_at_once": at_once,
                           "memory_fraction": memory_fraction(gpus), "auto": bool((place or {}).get("auto"))}
    packing = (place or {}).get("packing")
    if packing:
        out["chosen"] = packing["reason"]
    return out


def trials_at_once(cfg: ExperimentConfig) -> int:
    """``search.max_concurrent_trials`` of a config whose ``auto`` was resolved (:func:`resolve`); 1 without a
    search."""
    value = cfg.search.max_concurrent_trials if cfg.search else 1
    if value == "auto":
        raise RuntimeError("search.max_concurrent_trials is still 'auto': resolve(cfg, ...) first")
    return int(value)


def resolved(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` itself when ``resources.gpus_per_worker`` is a number, else :func:`resolve`'s config."""
    return cfg if cfg.resources.gpus_per_worker != "auto" else resolve(cfg)[0]


# --------------------------------------------------------------------------- in a trial or worker
def assigned_gpu_ids() -> list[str]:
    """The GPUs Ray gave this process (``ray.get_gpu_ids()``; none outside Ray: a process that never imported ray
    is not in it)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    return [str(i) for i in ray.get_gpu_ids()]


def cap_memory(device: torch.device, gpus: float) -> float | None:
    """In a process given ``gpus`` (a share below 1) of the CUDA ``device``: cap what its caching allocator may hold
    at :func:`raysent.train.packing.memory_fraction` of the device's memory (``set_per_process_memory_fraction``), so
    that it cannot run the trials it shares the GPU with out of memory; beyond it, it fails with CUDA's out-of-memory
    error. Returns the cap (a fraction of the device's memory), None when there is none (a whole GPU, the CPU).
    Calling it again (a reused trial process) sets the new trial's cap, or lifts it."""
    fraction = memory_fraction(gpus)
    if device.type != "cuda":
        return None
    torch.cuda.set_per_process_memory_fraction(1.0 if fraction is None else fraction, device)
    return fraction


def claim_devices(gpu_ids: list[str] | None = None) -> torch.device:
    """What a Tune trial or Ray Train worker does first: given no GPU (``gpu_ids``, default Ray's
    ``ray.get_gpu_ids()``), hide every GPU (``CUDA_VISIBLE_DEVICES=""``, before torch touches CUDA) and train on
    the CPU; given GPUs, train on the first that Ray made visible (Ray sets ``CUDA_VISIBLE_DEVICES`` to them).
    Returns that device. Calling it again changes nothing."""
    ids = assigned_gpu_ids() if gpu_ids is None else list(gpu_ids)
    if not ids:
        os.environ[VISIBLE] = ""
        return torch.device("cpu")
    from raysent.train.device import default_device

    return default_device()


__all__ = ["HIDE_ON_ZERO", "Placement", "cap_memory", "claim_devices", "packable", "placement", "resolve",
           "run_record", "tune_trial_resources", "train_worker_resources"]

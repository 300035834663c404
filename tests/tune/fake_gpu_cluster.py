"""Run by tests/tune/test_resources.py in a process of its own: a local Ray started as raysent starts one, told it
has one GPU (``ray.init(num_gpus=1)``; this machine has none), and probe trials and workers that report what Ray
gave them and what they see. Nothing trains on the fake GPU. Prints one JSON object, the last line of stdout."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

TARGET = 4  # probes that wait for this many to hold their resources at once
GIB = 2**30


def measured_probe(cfg=None, rates=(30.0, 55.0, 57.0), peak_gib: float = 2.0, most: int = 8):
    """A GPU probe's measurements as an H200 gives them for a small trial (1, 2, 4 copies: ``rates`` steps/s
    together, ``peak_gib`` each), of ``cfg``'s trials when given: what `raysent tune` caches in the experiment's
    folder. With the default rates auto chooses 2 trials per GPU (4 gain less than 5 % more)."""
    from raysent.train.packing import Probe, ProbePoint

    points = tuple(ProbePoint(k, rate, int(peak_gib * GIB), int(k * (peak_gib + 0.5) * GIB))
                   for k, rate in zip((1, 2, 4), rates))
    key = {}
    if cfg is not None:
        from raysent.tune.gpu_probe import probe_key

        key = probe_key(cfg)
    return Probe(device="NVIDIA H200", total_bytes=141 * GIB, points=points, most=most, key=key, seconds=40.0)


def probe_trial(config: dict) -> None:
    """A Tune trial: what it sees before and after claiming its devices, what it was given, how many trials
    held their resources while it did (a counter actor), and its process (reused or not)."""
    import ray
    from ray import tune

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    from raysent.train.resources import claim_devices

    device = claim_devices()
    counter = ray.get_actor("counter")
    ray.get(counter.enter.remote())
    deadline = time.time() + config["wait"]
    while ray.get(counter.running.remote()) < config["target"] and time.time() < deadline:
        time.sleep(0.2)
    peak = ray.get(counter.peak.remote())
    time.sleep(0.5)
    ray.get(counter.leave.remote())
    tune.report({"gpu_ids": json.dumps([str(i) for i in ray.get_gpu_ids()]), "before": json.dumps(before),
                 "after": json.dumps(os.environ.get("CUDA_VISIBLE_DEVICES")), "device": str(device),
                 "given": json.dumps(tune.get_context().get_trial_resources().required_resources),
                 "peak": peak, "pid": os.getpid()})


def probe_worker(config: dict) -> None:
    """A Ray Train worker: the same, and the device Ray Train hands the loop (raysent's RayHooks use it)."""
    import ray
    import ray.train
    import ray.train.torch

    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    from raysent.train.resources import claim_devices

    device = claim_devices()
    seen = {"gpu_ids": [str(i) for i in ray.get_gpu_ids()], "before": before,
            "after": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": str(device),
            "train_device": str(ray.train.torch.get_device())}
    with open(config["out"], "w") as f:  # Train V2 keeps metrics only with a checkpoint
        json.dump(seen, f)


def main() -> None:
    import ray
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from raysent.config import parse_config
    from raysent.train.ray_train import init_ray, make_trainer
    from raysent.train.resources import resolve, train_worker_resources, tune_trial_resources

    root = sys.argv[1]
    base = {"name": "fake", "method": "simcse-unsup", "model": {"name": "raw-bert-mini-mlm"},
            "train": {"batch_size": 4}, "tracking": {"results_dir": root},
            "search": {"max_concurrent_trials": 8, "space": {"lr": {"type": "choice", "values": [1.0e-4]}}}}

    def cfg(**resources):
        return parse_config({**base, "resources": {"cpus_per_worker": 0.5, **resources}}, source="<fake>")

    init_ray(cfg(), log_to_driver=False, num_cpus=8, num_gpus=1, include_dashboard=False)
    out: dict = {"cluster": {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}}

    # auto, resolved on this cluster as the driver resolves it
    auto, place = resolve(cfg(), trials=8)
    out["auto"] = {"gpus_per_worker": auto.resources.gpus_per_worker, "describe": place.describe(),
                   "at_once": place.at_once, "record": place.record()}

    @ray.remote(num_cpus=0)
    class Counter:
        def __init__(self):
            self.now = self.top = 0

        def enter(self):
            self.now += 1
            self.top = max(self.top, self.now)

        def leave(self):
            self.now -= 1

        def running(self):
            return self.now

        def peak(self):
            return self.top

    def search(c, trials: int, target: int, name: str) -> list[dict]:
        counter = Counter.options(name="counter").remote()  # the trials find it by its name
        tuner = tune.Tuner(tune.with_resources(probe_trial, tune_trial_resources(c)),
                           param_space={"i": tune.grid_search(list(range(trials))), "target": target, "wait": 60},
                           tune_config=tune.TuneConfig(max_concurrent_trials=c.search.max_concurrent_trials,
                                                       reuse_actors=True),
                           run_config=tune.RunConfig(name=name, storage_path=root, verbose=0))
        started = time.time()
        results = tuner.fit()
        out.setdefault("seconds", {})[name] = time.time() - started
        ray.kill(counter)
        assert not results.errors, results.errors
        return [r.metrics for r in results]

    # auto, where the search's GPU probe has run: no CUDA here, so the probe task (given the fake GPU) measures nothing
    from raysent.tune import gpu_probe

    cluster = {k: float(v) for k, v in out["cluster"].items()}
    said: list[str] = []
    started = time.time()
    unprobed = gpu_probe.packing_for(cfg(), Path(root) / "unprobed", cluster, 8, said.append)
    out["unprobed"] = {"reason": unprobed.reason if unprobed else None, "said": said,
                       "cached": (Path(root) / "unprobed" / gpu_probe.PROBE_FILE).exists(),
                       "seconds": time.time() - started}
    # auto, with the measurements a probe on an H200 cached in the experiment: 2 trials per GPU, 2 at once
    exp = Path(root) / "packed"
    gpu_probe.save(exp, measured_probe(cfg()))
    packing = gpu_probe.packing_for(cfg(), exp, cluster, 8, said.append)
    packed = resolve(cfg(), trials=8, packing=packing)
    out["packed"] = {"describe": packed[1].describe(), "plan": packed[1].record(),
                     "gpus_per_worker": packed[0].resources.gpus_per_worker,
                     "trials": search(packed[0], 8, 2, "packed")}
    # a quarter of a GPU each: four trials on the one GPU at once
    quarter = resolve(cfg(gpus_per_worker=0.25), trials=8)
    out["quarter"] = {"plan": quarter[1].record(), "trials": search(quarter[0], 8, TARGET, "quarter")}
    # no GPU asked for, on a cluster that has one
    zero = resolve(cfg(gpus_per_worker=0), trials=1)[0]
    out["zero"] = {"trials": search(zero, 1, 1, "zero")}

    # a Ray Train worker that asked for no GPU, with the resources raysent's trainer asks for (gloo, as raysent's)
    workers = {}
    for name, gpus in (("zero", 0),):
        c = resolve(cfg(workers=1, gpus_per_worker=gpus))[0]
        use_gpu, per_worker = train_worker_resources(c)
        started = time.time()
        trainer = TorchTrainer(probe_worker, train_loop_config={"out": f"{root}/worker-{name}.json"},
                               torch_config=TorchConfig(backend="gloo"),
                               scaling_config=ScalingConfig(num_workers=1, use_gpu=use_gpu,
                                                            resources_per_worker=per_worker),
                               run_config=RunConfig(name=f"worker-{name}", storage_path=root))
        trainer.fit()
        with open(f"{root}/worker-{name}.json") as f:
            workers[name] = {"asked": per_worker, "use_gpu": use_gpu, "seen": json.load(f),
                             "seconds": time.time() - started}
    out["workers"] = workers
    # raysent's own trainer on this cluster: auto and a share, as the driver hands them over
    trainers = {}
    for name, resources in (("auto", {"workers": 1}), ("zero", {"workers": 1, "gpus_per_worker": 0})):
        t = make_trainer(cfg(**resources))
        trainers[name] = {"use_gpu": t.scaling_config.use_gpu,
                          "per_worker": t.scaling_config.resources_per_worker,
                          "backend": t.backend_config.backend,
                          "config_gpus": t.train_loop_config["config"]["resources"]["gpus_per_worker"]}
    out["trainers"] = trainers
    ray.shutdown()
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()

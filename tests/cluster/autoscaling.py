"""Ray's own harness for what `ray up` does, on one machine: ``ray.cluster_utils.AutoscalingCluster`` (a head whose
autoscaler adds worker nodes of the given types through Ray's ``fake_multinode`` provider, GPU resources included),
with the node types of ``clusters/gpu.yaml``.

Three changes to Ray's class, each because of this machine, none to what the autoscaler does:

* Its config template, ``ray/autoscaler/_private/fake_multi_node/example.yaml``, is not in the ray 2.60 wheel (the
  class fails with FileNotFoundError): the same keys are written here (the file in ray-project/ray, python/ray/
  autoscaler/_private/fake_multi_node/example.yaml).
* Its ``start()`` and ``shutdown()`` run ``ray stop --force``, which stops every Ray on the machine, the test
  session's included: this head gets a free port and a temp dir of its own, and is stopped by its processes alone.
* The fake provider starts nodes against port 6379 unless the provider config names the GCS (``gcs_address``).

One change to the config: idle nodes are ended after 5 minutes, `ray up`'s default (`idle_timeout_minutes`), not
6 s, so the GPU nodes the search phase started serve its final phase too, as a real cluster's would. And the head
starts without ``CUDA_VISIBLE_DEVICES`` (in ``start``).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import psutil
import yaml
from ray.cluster_utils import AutoscalingCluster

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_cluster(temp_dir: str) -> None:
    """Every process of one cluster (never another Ray on the machine, as `ray stop` would)."""
    roots = [p for p in psutil.process_iter(["cmdline"]) if any(temp_dir in part for part in p.info["cmdline"] or [])]
    procs = {p.pid: p for r in roots for p in [r, *r.children(recursive=True)]}
    for p in procs.values():
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=15)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    shutil.rmtree(temp_dir, ignore_errors=True)


def gpu_yaml_node_types(path: Path = REPO / "clusters" / "gpu.yaml") -> tuple[dict, dict, int]:
    """(the head's resources, the worker node types, max_workers) of a cluster-launcher YAML, as the autoscaler
    reads them (node_config is the cloud's: the fake provider needs none)."""
    config = yaml.safe_load(path.read_text())
    head = config["head_node_type"]
    types = {name: {"resources": t["resources"], "node_config": {}, "min_workers": t.get("min_workers", 0),
                    "max_workers": t["max_workers"]}
             for name, t in config["available_node_types"].items() if name != head}
    return dict(config["available_node_types"][head]["resources"]), types, config["max_workers"]


class IsolatedAutoscalingCluster(AutoscalingCluster):
    """:class:`ray.cluster_utils.AutoscalingCluster` on its own port and temp dir (the module docstring)."""

    def __init__(self, head_resources: dict, worker_node_types: dict, **config_kwargs):
        self.port = free_port()
        self.temp_dir = f"/tmp/rs-as-{os.getpid()}-{self.port}"  # Ray's sockets need a short path
        self.address = f"127.0.0.1:{self.port}"
        super().__init__(head_resources, worker_node_types, **config_kwargs)

    def _generate_config(self, head_resources, worker_node_types, autoscaler_v2=False, **config_kwargs):
        config = {
            "cluster_name": "fake_multinode", "max_workers": 8,
            "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                         "disable_launch_config_check": True, "gcs_address": self.address},
            "available_node_types": {**worker_node_types, "ray.head.default": {
                "resources": dict(head_resources), "node_config": {}, "max_workers": 0}},
            "head_node_type": "ray.head.default", "auth": {}, "upscaling_speed": 1.0, "idle_timeout_minutes": 5,
            "docker": {}, "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
            "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
            "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
            "rsync_exclude": [], "rsync_filter": []}
        config.update(config_kwargs)
        return config

    @property
    def config_file(self) -> str:
        return os.path.join(self.temp_dir, "autoscaling.json")

    def start(self, _system_config=None, override_env=None):
        os.makedirs(self.temp_dir, exist_ok=True)
        with open(self.config_file, "w") as f:
            json.dump(self._config, f)
        head = dict(self._head_resources)
        cmd = [shutil.which("ray") or "ray", "start", "--head", f"--port={self.port}", f"--temp-dir={self.temp_dir}",
               f"--autoscaling-config={self.config_file}", "--node-ip-address=127.0.0.1", "--disable-usage-stats",
               "--include-dashboard=false", f"--num-cpus={head.pop('CPU', 0)}", f"--num-gpus={head.pop('GPU', 0)}"]
        if head:
            cmd.append(f"--resources={json.dumps(head)}")
        # not CUDA_VISIBLE_DEVICES: the fake GPU nodes inherit the head's environment, and Ray refuses to start a
        # raylet with more GPUs than that mask shows (an empty mask, left by another test: "Attempting to start raylet
        # with 1 GPU, but CUDA_VISIBLE_DEVICES contains []"); on a real cluster each node sees its own GPUs
        env = {**{k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")},
               "RAY_AUTH_MODE": "disabled",
               "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1", **(override_env or {})}
        subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=180)

    def shutdown(self):
        stop_cluster(self.temp_dir)

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the autoscaler's log (``monitor.log``) and of each raylet's, for a test that timed out
        to say what the cluster was doing."""
        out = []
        for log in sorted(Path(self.temp_dir).glob("session_2*/logs/monitor.log")) + \
                sorted(Path(self.temp_dir).glob("session_2*/logs/raylet*.out")):  # not session_latest, a link
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out) or f"no logs under {self.temp_dir}"

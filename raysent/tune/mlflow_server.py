"""MLflow for trials on other nodes: a tracking server on the driver over the search's local store.

A seed's live MLflow run is written from its trial's process, on whichever node Tune put it. A local store
(``sqlite:///<results>/mlflow.db``, the default) is a file on the driver: a trial on another node would write
a sqlite file on its own disk, or fail. So when a search runs on more than one node (``tracking.server:
auto``: the Ray cluster has more than one live node when the search starts; ``always``: on any cluster, e.g.
an autoscaler's that starts with its head alone) and its store is local, raysent starts ``mlflow server`` on
the driver over that store, for the time of the search, and gives the trials its ``http://`` URI:

- it listens on the driver's address in the Ray cluster (the node's ``NodeManagerAddress``), never
  ``0.0.0.0``, and accepts only that host name (``--allowed-hosts``); ``tracking.server_port`` sets its port
  (default: a free one); it has no authentication: the cluster's firewall keeps it to the cluster's nodes
  (docs/cluster.md);
- run artifacts are written by the driver (the experiment's artifact folder is on its disk); trials send
  params, metrics, tags and their end over HTTP;
- it stops when the search ends, however it ends; its log is ``results/<experiment>/mlflow-server.log``.

Before the first trial, every node of the cluster is asked to reach the URI the trials will use
(:func:`check_reach`): a URI some node cannot reach is an error that names the nodes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from raysent.config import ExperimentConfig
from raysent.errors import RaysentError
from raysent.tracking import redact

# Lazy imports: ray (heavy, and only the functions that need them import them).

HEALTH_TIMEOUT_S = 120  # `mlflow server` answered /health after ~16 s on 2 cores (STACK-NOTES)


def is_local_store(uri: str) -> bool:
    return uri.startswith("sqlite:///") or uri.startswith("file:") or "://" not in uri


def alive_nodes() -> list[dict]:
    import ray

    return [n for n in ray.nodes() if n.get("Alive")]


def driver_address() -> str:
    """This process's node's address in the Ray cluster (what other nodes reach it by)."""
    import ray

    me = ray.get_runtime_context().get_node_id()
    for node in alive_nodes():
        if node["NodeID"] == me:
            return str(node["NodeManagerAddress"])
    return ray.util.get_node_ip_address()


def wanted(cfg: ExperimentConfig, uri: str) -> bool:
    """Whether this search serves its local store to the trials (the module docstring)."""
    mode = cfg.tracking.server
    if not cfg.tracking.enabled or mode == "never" or not is_local_store(uri):
        return False
    return mode == "always" or len(alive_nodes()) > 1


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class TrackingServer:
    """``mlflow server`` over ``store`` (a local URI) on ``host:port``, in its own process group, until
    :meth:`stop`."""

    def __init__(self, store: str, artifacts: Path, host: str, port: int | None, log: Path):
        self.store, self.artifacts, self.host, self.log = store, artifacts, host, log
        self.port = port or _free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> TrackingServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", self.store,
               "--artifacts-destination", self.artifacts.as_uri(), "--host", self.host, "--port", str(self.port),
               "--allowed-hosts", f"{self.host}:{self.port},{self.host}", "--workers", "2"]
        env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
        # the trials log runs, metrics and models; MLflow's job runner (a runner and seven Huey consumers, for its
        # GenAI jobs) serves none of that: 20 s after the start, 13 processes and 45 CPU-s with it, 5 and 14 without,
        # and the server answers after 11 s instead of 19 (2026-11-29, 2 idle cores)
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + HEALTH_TIMEOUT_S
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RaysentError(f"mlflow server on {self.host}:{self.port} exited ({self.proc.returncode}) before "
                                   f"it answered: see {self.log} (a port in use? tracking.server_port sets it)")
            if answers(self.url, timeout=2):
                return self
            time.sleep(1)
        self.stop()
        raise RaysentError(f"mlflow server on {self.host}:{self.port} did not answer within {HEALTH_TIMEOUT_S} s: "
                           f"see {self.log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)  # uvicorn and its workers
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=15)


def serve(cfg: ExperimentConfig, exp: Path, uri: str, say: Callable[[str], None]) -> TrackingServer | None:
    """A started :class:`TrackingServer` over the local store ``uri`` when the search runs on more than one node
    (:func:`wanted`), else None; its log is ``results/<experiment>/mlflow-server.log``."""
    if not wanted(cfg, uri):
        return None
    host = driver_address()
    server = TrackingServer(uri, Path(cfg.tracking.results_dir).resolve() / "mlartifacts", host,
                            cfg.tracking.server_port, exp / "mlflow-server.log")
    say(f"MLflow: the search runs on {len(alive_nodes())} node(s) and its store is a file here: serving "
        f"{redact(uri)} to the trials at {server.url} (listening on {host} only, until the search ends)")
    return server.start()


def answers(url: str, timeout: float = 5) -> bool:
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def check_reach(uri: str, field: str) -> None:
    """Every live node of the Ray cluster reaches the tracking URI the trials will use (one task per node,
    pinned to it); a local store on a cluster of several nodes is refused. Raises what to do."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


    nodes = alive_nodes()
    if len(nodes) < 2:
        return
    if is_local_store(uri):
        raise RaysentError(f"{field}: the MLflow store {redact(uri)} is a file on this machine, and the search runs "
                           f"on {len(nodes)} nodes: trials elsewhere cannot write it. Leave tracking.server at auto "
                           "(raysent then serves it to the trials) or give a tracking server every node reaches "
                           "(--set tracking.mlflow_uri=http://HOST:PORT)")
    if not uri.startswith(("http://", "https://")):
        return
    probe = ray.remote(num_cpus=0)(answers)
    refs = {n["NodeManagerAddress"]: probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(uri) for n in nodes}
    unreachable = [addr for addr, ref in refs.items() if not ray.get(ref, timeout=60)]
    if unreachable:
        raise RaysentError(f"{field}: the MLflow tracking server {redact(uri)} does not answer from the node(s) "
                           f"{', '.join(sorted(unreachable))} of the Ray cluster, where trials run. Let it listen "
                           "on an address they reach (and open its port to them), or use one that does")

"""The cluster configs in ``clusters/`` and the README commands that use them, checked offline.

* every cluster-launcher YAML (``gpu.yaml``, ``local.yaml``: any file in ``clusters/`` without a
  Kubernetes ``kind``) validates against the JSON schema the installed ray ships
  (``ray/autoscaler/ray-schema.json``, draft-07), and passes Ray's own check: ``prepare_config``
  (merges the provider's defaults) then ``validate_config`` (the schema again, plus Ray's semantic
  checks), as ``ray up`` does before it contacts any cloud;
* the local provider's whole bootstrap (``_bootstrap_config``, what ``ray up`` runs before it opens
  SSH connections) runs here too. The AWS one cannot: ``bootstrap_aws`` imports boto3 and asks AWS
  for the IAM role, key pair, security group, subnets and the AMI, so it needs credentials and the
  network; everything before it (prepare + validate) is checked;
* a typo'd key or a wrong type in a copy of ``gpu.yaml`` is caught, with the message asserted;
* the KubeRay manifest (``kuberay.yaml``, several documents): its ``RayCluster`` has every field KubeRay
  requires (checked here field by field: the CRD schema lives in the cluster, not in any package installed
  here), runs the raysent image on every pod, and has GPU groups that mirror ``gpu.yaml``'s node types; its
  ConfigMap's autoscaler node types equal the groups (and what Ray's own KubeRay autoscaler code derives from
  them), so ``raysent.train.resources.capacity_of_config`` counts every GPU; the results claim is mounted on
  the head and the shared claim on every pod, where the env vars and docs/cluster.md's commands point;
* ``clusters/Dockerfile`` builds on Ray's GPU image of the installed ray, installs the pinned torch before the
  project (not editable) and runs ``pip check``; ``.dockerignore`` sends Docker its COPY sources and nothing else;
* the Ray version pinned in the setup commands and the manifest equals the installed
  ``ray.__version__``: upgrading ray fails this test until the configs are updated;
* every ``ray ...`` line in docs/cluster.md, section "Scale out: a Ray cluster", and every ``ray``
  command in the configs' setup/start commands, names an existing subcommand and only flags that
  its ``--help`` lists (through click's CliRunner on ``ray.scripts.scripts.cli``).

Not checked offline: AWS credentials, quotas and instance availability, the SSM-resolved AMI,
SSH to the machines of ``local.yaml``, the Kubernetes API server and KubeRay's CRD, the storage classes and
the registry, whether ``docker build`` succeeds (no Docker engine here), and whether the pip installs in the setup
commands succeed on the nodes.
"""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util
import json
import re
import shlex
import subprocess
from pathlib import Path

import click
import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from conftest import REPO

CLUSTERS = REPO / "clusters"
README = REPO / "docs" / "cluster.md"  # the cluster guide
README_SECTION = "## Scale out: a Ray cluster"
# read from the installed package without importing ray: the tests that run Ray's own code are marked slow
RAY_VERSION = importlib.metadata.version("ray")
_RAY_SPEC = importlib.util.find_spec("ray")  # a top-level name: found, not imported
assert _RAY_SPEC is not None and _RAY_SPEC.submodule_search_locations, "ray is not installed"
RAY_PACKAGE = Path(list(_RAY_SPEC.submodule_search_locations)[0])

# Importing ray's CLI imports ray.serve, whose pydantic models warn on import (ray's, not ours).
pytestmark = pytest.mark.filterwarnings("ignore:Using extra keyword arguments on `Field`:DeprecationWarning")


def _load(path: Path):
    """A one-document YAML file (a cluster-launcher config)."""
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _load_all(path: Path) -> list:
    """Every document of a YAML file (a Kubernetes manifest holds several, split by ``---``)."""
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _is_launcher_config(docs: list) -> bool:
    return len(docs) == 1 and isinstance(docs[0], dict) and "kind" not in docs[0] and "provider" in docs[0]


def _document(path: Path, kind: str, name: str | None = None) -> dict:
    """The one document of ``kind`` (and ``metadata.name``) in a manifest."""
    found = [d for d in _load_all(path) if isinstance(d, dict) and d.get("kind") == kind
             and (name is None or (d.get("metadata") or {}).get("name") == name)]
    assert len(found) == 1, f"{path.name}: {len(found)} documents of kind {kind} {name or ''}"
    return found[0]


def _raycluster(path: Path | None = None) -> dict:
    return _document(path or CLUSTERS / "kuberay.yaml", "RayCluster")


ALL_YAML = sorted(CLUSTERS.glob("*.yaml"))
LAUNCHER_FILES = [p for p in ALL_YAML if _is_launcher_config(_load_all(p))]
KUBERAY_FILES = [p for p in ALL_YAML if any(isinstance(d, dict) and d.get("kind") == "RayCluster" for d in _load_all(p))]
DOCKERFILE = CLUSTERS / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
COMMAND_KEYS = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
                "head_start_ray_commands", "worker_start_ray_commands")


@pytest.fixture(scope="module")
def ray_schema() -> dict:
    path = RAY_PACKAGE / "autoscaler" / "ray-schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))
    assert schema.get("$schema", "").startswith("http://json-schema.org/draft-07/schema"), schema.get("$schema")
    jsonschema.Draft7Validator.check_schema(schema)
    return schema


def _schema_errors(config: dict, schema: dict) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return sorted(f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
                  for e in validator.iter_errors(config))


def _ray_prepare_and_validate(config: dict) -> dict:
    """What ``ray up`` does first, offline (see the module docstring for the AWS bootstrap)."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


# --------------------------------------------------------------------------- which files
def test_every_cluster_file_is_checked():
    names = {p.name for p in ALL_YAML}
    assert {"gpu.yaml", "local.yaml", "kuberay.yaml"} <= names, names
    assert {p.name for p in LAUNCHER_FILES} >= {"gpu.yaml", "local.yaml"}
    assert [p.name for p in KUBERAY_FILES] == ["kuberay.yaml"]
    unchecked = names - {p.name for p in LAUNCHER_FILES} - {p.name for p in KUBERAY_FILES}
    assert not unchecked, f"cluster files no test validates: {sorted(unchecked)}"


# --------------------------------------------------------------------------- cluster-launcher YAMLs
@pytest.mark.parametrize("path", LAUNCHER_FILES, ids=lambda p: p.name)
def test_launcher_config_matches_rays_json_schema(path, ray_schema):
    assert _schema_errors(_load(path), ray_schema) == []


@pytest.mark.slow  # runs ray's own code (imports ray)
@pytest.mark.parametrize("path", LAUNCHER_FILES, ids=lambda p: p.name)
def test_launcher_config_passes_rays_own_check(path):
    config = _load(path)
    prepared = _ray_prepare_and_validate(config)
    types = prepared["available_node_types"]
    assert prepared["head_node_type"] in types
    for name, node_type in types.items():
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"], name
    assert sum(t["min_workers"] for t in types.values()) <= prepared["max_workers"]


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_local_config_passes_the_whole_local_bootstrap():
    """The local provider's bootstrap needs no network: run all of it, as `ray up` would."""
    from ray.autoscaler._private.commands import _bootstrap_config

    config = _load(CLUSTERS / "local.yaml")
    boot = _bootstrap_config(copy.deepcopy(config), no_config_cache=True)
    (node_type,) = boot["available_node_types"].values()
    n_ips = len(config["provider"]["worker_ips"])
    assert node_type["min_workers"] == node_type["max_workers"] == n_ips
    assert boot["provider"]["head_ip"] == config["provider"]["head_ip"]


def test_gpu_config_declares_a_cpu_head_and_gpu_worker_types():
    config = _load(CLUSTERS / "gpu.yaml")
    assert config["provider"]["type"] == "aws"
    assert config["auth"]["ssh_user"] == "ubuntu"
    assert config["provider"]["cache_stopped_nodes"] is False, "`ray down` must terminate, not stop (billed disks)"
    assert config["idle_timeout_minutes"] > 0
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0, "the head must not offer GPUs to Ray Train workers"
    expected = {"g5.xlarge": (1, "A10G"), "p4d.24xlarge": (8, "A100")}
    seen = {}
    for name, node_type in types.items():
        if name == config["head_node_type"]:
            continue
        instance = node_type["node_config"]["InstanceType"]
        gpus, kind = expected[instance]
        assert node_type["resources"]["GPU"] == gpus, name
        assert node_type["resources"][f"accelerator_type:{kind}"] == 1, name
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"], name
        seen[instance] = name
    assert set(seen) == set(expected)
    for node_type in types.values():  # one image everywhere: Ray needs the same Python on all nodes
        assert node_type["node_config"]["ImageId"] == head["node_config"]["ImageId"]


def _start_command_flags(command: str, sub: str) -> dict[str, str | None]:
    """``--flag value`` / ``--flag=value`` pairs of the ``ray <sub>`` invocations in a shell command."""
    flags: dict[str, str | None] = {}
    for words in _ray_invocations(command):
        if words[1:2] != [sub]:
            continue
        for i, word in enumerate(words):
            if word.startswith("--"):
                name, eq, value = word.partition("=")
                if eq:
                    flags[name] = value
                else:
                    nxt = words[i + 1] if i + 1 < len(words) else None
                    flags[name] = None if nxt is None or nxt.startswith("-") else nxt
    return flags


@pytest.mark.parametrize("path", LAUNCHER_FILES, ids=lambda p: p.name)
def test_launcher_config_installs_raysent_and_binds_the_dashboard_to_localhost(path):
    config = _load(path)
    assert config["file_mounts"] == {"~/raysent": ".", "~/.ray/auth_token": "~/.ray/auth_token"}
    setup = config["setup_commands"]
    torch_at = next(i for i, c in enumerate(setup) if re.search(r"pip install [^;&|]*\btorch\b", c))
    raysent_at = next(i for i, c in enumerate(setup) if "pip install -e ~/raysent" in c)
    assert torch_at < raysent_at, "torch must be installed before raysent (which would pull a default build)"
    env_lines = "\n".join(setup)
    assert 'export RAYSENT_DATA_DIR="$HOME/raysent-cache/data"' in env_lines
    assert 'export RAYSENT_MODEL_DIR="$HOME/raysent-cache/models"' in env_lines
    assert any("mkdir -p ~/raysent-cache/data ~/raysent-cache/models" in c for c in setup)
    assert set(config["cluster_synced_files"]) == {"~/raysent-cache/data", "~/raysent-cache/models"}

    head_flags = {}
    for command in config["head_start_ray_commands"]:
        head_flags.update(_start_command_flags(command, "start"))
    assert head_flags.get("--dashboard-host") == "127.0.0.1", head_flags
    assert "--head" in head_flags
    worker_flags = {}
    for command in config["worker_start_ray_commands"]:
        worker_flags.update(_start_command_flags(command, "start"))
    assert worker_flags.get("--address") == "$RAY_HEAD_IP:6379", worker_flags


def _env_of_ray_start(command: str) -> dict[str, str]:
    """What a shell command puts in the environment of its ``ray start``: variables exported before it, and
    assignments prefixed to it (``X=1 ray start``; prefixed to another command, they are that command's only)."""
    env: dict[str, str] = {}
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True

    def assignment(word: str) -> tuple[str, str] | None:
        m = re.fullmatch(r"([A-Za-z_]\w*)=(\S*)", word)
        return (m[1], m[2]) if m else None

    words: list[str] = []
    for token in list(lexer) + [";"]:
        if not (token and set(token) <= set(";&|")):
            words.append(token)
            continue
        if words[:1] == ["export"]:
            env.update(a for a in map(assignment, words[1:]) if a)
        else:
            n = 0
            while n < len(words) and assignment(words[n]):
                n += 1
            if words[n:n + 2] == ["ray", "start"]:
                return {**env, **dict(filter(None, map(assignment, words[:n])))}
        words = []
    return {}


def security_problems(config: dict) -> list[str]:
    """Why a launcher config would start a cluster that takes work from anyone who reaches its ports: token
    authentication not turned on (RAY_AUTH_MODE=token) where Ray starts and where clients run on the nodes, no
    shared token on the nodes, or a server asked to listen beyond the node (0.0.0.0) or a dashboard off 127.0.0.1."""
    from ray._private.authentication.authentication_token_setup import AUTH_MODE_ENV_VAR, _get_default_token_path

    problems = []
    token = "~/" + _get_default_token_path().relative_to(Path.home()).as_posix()  # where Ray looks: ~/.ray/auth_token
    if (config.get("file_mounts") or {}).get(token) != token:
        problems.append(f"file_mounts: no {token!r}: {token!r} (every node needs the token of `ray get-auth-token`)")
    setup = "\n".join(config.get("setup_commands") or [])
    if f"export {AUTH_MODE_ENV_VAR}=token" not in setup:
        problems.append(f"setup_commands: the nodes' environment does not export {AUTH_MODE_ENV_VAR}=token")
    if f"chmod 600 {token}" not in setup:
        problems.append(f"setup_commands: no `chmod 600 {token}`")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in config.get(key) or [] if _start_command_flags(c, "start")]
        if not starts or any(_env_of_ray_start(c).get(AUTH_MODE_ENV_VAR) != "token" for c in starts):
            problems.append(f"{key}: `ray start` without {AUTH_MODE_ENV_VAR}=token")
        for c in starts:
            flags = _start_command_flags(c, "start")
            wide = sorted(f for f, v in flags.items() if v in ("0.0.0.0", "::"))
            if wide:
                problems.append(f"{key}: {', '.join(wide)} listens on every interface")
            if key == "head_start_ray_commands" and flags.get("--dashboard-host") != "127.0.0.1":
                problems.append(f"{key}: --dashboard-host is {flags.get('--dashboard-host')!r}, not 127.0.0.1")
    return problems


@pytest.mark.slow  # runs ray's own code (imports ray)
@pytest.mark.parametrize("path", LAUNCHER_FILES, ids=lambda p: p.name)
def test_launcher_config_turns_token_auth_on_and_keeps_the_dashboard_on_localhost(path):
    config = _load(path)
    assert security_problems(config) == []
    head = next(c for c in config["head_start_ray_commands"] if "--head" in _start_command_flags(c, "start"))
    assert _env_of_ray_start(head) == {"RAY_AUTH_MODE": "token"}


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_security_checker_catches_an_open_cluster(tmp_path):
    text = (CLUSTERS / "gpu.yaml").read_text(encoding="utf-8")
    for old, new in (("    export RAY_AUTH_MODE=token;\n", ""), ("--dashboard-host 127.0.0.1", "--dashboard-host 0.0.0.0"),
                     ('  "~/.ray/auth_token": "~/.ray/auth_token"\n', ""), ("'export RAY_AUTH_MODE=token'\n", ""),
                     ("export RAY_AUTH_MODE=token; ulimit", "ulimit")):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    bad = yaml.safe_load(text)
    assert security_problems(bad) == [
        "file_mounts: no '~/.ray/auth_token': '~/.ray/auth_token' (every node needs the token of `ray get-auth-token`)",
        "setup_commands: the nodes' environment does not export RAY_AUTH_MODE=token",
        "head_start_ray_commands: `ray start` without RAY_AUTH_MODE=token",
        "head_start_ray_commands: --dashboard-host listens on every interface",
        "head_start_ray_commands: --dashboard-host is '0.0.0.0', not 127.0.0.1",
        "worker_start_ray_commands: `ray start` without RAY_AUTH_MODE=token",
    ]
    # set after `ray start`, or for another command, it does not count
    assert _env_of_ray_start("ray start --head; export RAY_AUTH_MODE=token") == {}
    assert _env_of_ray_start("RAY_AUTH_MODE=token ray stop; ray start --head") == {}
    assert _env_of_ray_start("RAY_AUTH_MODE=token ray start --head") == {"RAY_AUTH_MODE": "token"}


@pytest.mark.parametrize("path", LAUNCHER_FILES, ids=lambda p: p.name)
def test_launcher_commands_are_valid_shell(path):
    config = _load(path)
    for key in COMMAND_KEYS:
        for command in config.get(key) or []:
            proc = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
            assert proc.returncode == 0, f"{path.name} {key}: {command!r}: {proc.stderr}"


# --------------------------------------------------------------------------- a wrong field is caught
def _gpu_copy(tmp_path: Path, old: str, new: str) -> dict:
    """A copy of gpu.yaml with one textual edit (which must apply exactly once), loaded back."""
    text = (CLUSTERS / "gpu.yaml").read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times in gpu.yaml"
    copy_path = tmp_path / "gpu-copy.yaml"
    copy_path.write_text(text.replace(old, new), encoding="utf-8")
    return _load(copy_path)


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_typo_in_a_node_type_key_is_caught(tmp_path, ray_schema):
    bad = _gpu_copy(tmp_path, "    max_workers: 8\n", "    max_worker: 8\n")
    assert _schema_errors(bad, ray_schema) == [
        "available_node_types/gpu-1x-a10g: Additional properties are not allowed ('max_worker' was unexpected)"]
    with pytest.raises(jsonschema.ValidationError, match=r"\('max_worker' was unexpected\)"):
        _ray_prepare_and_validate(bad)


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_typo_in_a_top_level_key_is_caught(tmp_path, ray_schema):
    bad = _gpu_copy(tmp_path, "idle_timeout_minutes: 10\n", "idle_timeout_minute: 10\n")
    assert _schema_errors(bad, ray_schema) == [
        "<root>: Additional properties are not allowed ('idle_timeout_minute' was unexpected)"]
    with pytest.raises(jsonschema.ValidationError, match=r"\('idle_timeout_minute' was unexpected\)"):
        _ray_prepare_and_validate(bad)


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_wrong_type_for_min_workers_is_caught(tmp_path, ray_schema):
    bad = _gpu_copy(tmp_path, "    min_workers: 0                        # nothing runs",
                    "    min_workers: \"two\"                    # nothing runs")
    assert _schema_errors(bad, ray_schema) == [
        "available_node_types/gpu-1x-a10g/min_workers: 'two' is not of type 'integer'"]
    with pytest.raises(jsonschema.ValidationError, match=r"'two' is not of type 'integer'"):
        _ray_prepare_and_validate(bad)


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_min_workers_above_the_global_maximum_is_caught_by_ray(tmp_path, ray_schema):
    bad = _gpu_copy(tmp_path, "    min_workers: 0                        # nothing runs",
                    "    min_workers: 11                       # nothing runs")
    assert _schema_errors(bad, ray_schema) == []  # the schema cannot see it; Ray's own check does
    with pytest.raises(ValueError, match=r"global `max_workers` is smaller than the sum of `min_workers`"):
        _ray_prepare_and_validate(bad)


# --------------------------------------------------------------------------- KubeRay
_RAY_IMAGE = re.compile(r"^(?:docker\.io/)?rayproject/ray(?:-ml)?:(?P<version>\d+\.\d+\.\d+)(?:-|$)")


def raycluster_problems(doc: dict, ray_version: str) -> list[str]:
    """What KubeRay requires of a RayCluster (ray.io/v1), and a Ray version consistent throughout."""
    problems: list[str] = []

    def containers_of(where: str, template) -> list[dict]:
        spec = (template or {}).get("spec") if isinstance(template, dict) else None
        containers = (spec or {}).get("containers")
        if not isinstance(containers, list) or not containers:
            problems.append(f"{where}.template.spec.containers: missing or empty")
            return []
        for i, c in enumerate(containers):
            if not isinstance(c, dict) or not c.get("name"):
                problems.append(f"{where}.template.spec.containers[{i}].name: missing")
            image = c.get("image") if isinstance(c, dict) else None
            if not isinstance(image, str) or not image:
                problems.append(f"{where}.template.spec.containers[{i}].image: missing")
                continue
            m = _RAY_IMAGE.match(image)
            if m and m["version"] != ray_version:
                problems.append(f"{where}.template.spec.containers[{i}].image: {image} has Ray "
                                f"{m['version']}, the installed ray is {ray_version}")
        return containers

    def check_start_params(where: str, params) -> None:
        if not isinstance(params, dict):
            problems.append(f"{where}.rayStartParams: missing (a map of `ray start` flags, may be empty)")
            return
        for key, value in params.items():
            if not isinstance(value, str):
                problems.append(f"{where}.rayStartParams.{key}: must be a string, got {value!r}")

    if doc.get("apiVersion") != "ray.io/v1":
        problems.append(f"apiVersion: expected ray.io/v1, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != "RayCluster":
        problems.append(f"kind: expected RayCluster, got {doc.get('kind')!r}")
    name = (doc.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", name or ""):
        problems.append(f"metadata.name: missing or not a DNS-1123 label: {name!r}")
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return problems + ["spec: missing"]
    if spec.get("rayVersion") != ray_version:
        problems.append(f"spec.rayVersion: {spec.get('rayVersion')!r}, the installed ray is {ray_version!r}")

    head = spec.get("headGroupSpec")
    if not isinstance(head, dict):
        problems.append("spec.headGroupSpec: missing")
    else:
        check_start_params("spec.headGroupSpec", head.get("rayStartParams"))
        containers_of("spec.headGroupSpec", head.get("template"))

    groups = spec.get("workerGroupSpecs")
    if not isinstance(groups, list) or not groups:
        problems.append("spec.workerGroupSpecs: missing or empty")
        groups = []
    names = set()
    gpu_groups = 0
    for i, group in enumerate(groups):
        where = f"spec.workerGroupSpecs[{i}]"
        gname = group.get("groupName")
        if not isinstance(gname, str) or not gname:
            problems.append(f"{where}.groupName: missing")
        elif gname in names:
            problems.append(f"{where}.groupName: {gname!r} used twice")
        names.add(gname)
        counts = {k: group.get(k) for k in ("replicas", "minReplicas", "maxReplicas")}
        for key, value in counts.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(f"{where}.{key}: must be an integer >= 0, got {value!r}")
        if all(isinstance(v, int) and not isinstance(v, bool) for v in counts.values()) and not (
                counts["minReplicas"] <= counts["replicas"] <= counts["maxReplicas"]):
            problems.append(f"{where}: needs minReplicas <= replicas <= maxReplicas, got "
                            f"{counts['minReplicas']} / {counts['replicas']} / {counts['maxReplicas']}")
        if "rayStartParams" in group:
            check_start_params(where, group["rayStartParams"])
        for c in containers_of(where, group.get("template")):
            resources = c.get("resources") or {}
            limit = (resources.get("limits") or {}).get("nvidia.com/gpu")
            request = (resources.get("requests") or {}).get("nvidia.com/gpu")
            if limit is not None:
                gpu_groups += 1
                if int(limit) <= 0:
                    problems.append(f"{where}: nvidia.com/gpu limit must be > 0, got {limit!r}")
                if request is not None and str(request) != str(limit):
                    problems.append(f"{where}: nvidia.com/gpu request {request!r} must equal its limit {limit!r}")
    if groups and not gpu_groups:
        problems.append("spec.workerGroupSpecs: no group has an nvidia.com/gpu limit")
    return problems


def _pods(doc: dict) -> list[tuple[str, dict]]:
    """(group name, pod spec) of the head (``head``) and of every worker group."""
    spec = doc["spec"]
    return [("head", spec["headGroupSpec"]["template"]["spec"])] + [
        (g["groupName"], g["template"]["spec"]) for g in spec["workerGroupSpecs"]]


def _mounts(pod: dict) -> dict[str, dict]:
    """mountPath -> the volume mounted there, for the pod's Ray container (KubeRay's: the first)."""
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    return {m["mountPath"]: volumes[m["name"]] for m in pod["containers"][0].get("volumeMounts") or []}


def _claim_mount(pod: dict, claim: str) -> str | None:
    paths = [p for p, v in _mounts(pod).items() if (v.get("persistentVolumeClaim") or {}).get("claimName") == claim]
    assert len(paths) <= 1, paths
    return paths[0] if paths else None


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["containers"][0].get("env") or []}


def _quantity(value) -> int:
    """A whole-number Kubernetes quantity (cpu "4", nvidia.com/gpu "8")."""
    assert re.fullmatch(r"\d+", str(value)), f"{value!r}: give whole CPUs and GPUs (the autoscaler rounds up)"
    return int(value)


RESULTS_CLAIM, SHARED_CLAIM, AUTOSCALING_MAP = "raysent-results", "raysent-shared", "raysent-autoscaling"


def _autoscaling_config(path: Path | None = None) -> dict:
    """The autoscaler config of the ConfigMap and the path the head's RAYSENT_AUTOSCALING_CONFIG gives it."""
    cm = _document(path or CLUSTERS / "kuberay.yaml", "ConfigMap", AUTOSCALING_MAP)
    ((key, text),) = cm["data"].items()
    return yaml.safe_load(text) | {"__key__": key}


@pytest.mark.parametrize("path", KUBERAY_FILES, ids=lambda p: p.name)
def test_kuberay_manifest_has_the_required_fields(path):
    doc = _raycluster(path)
    assert raycluster_problems(doc, RAY_VERSION) == []
    # and the specifics of ours: GPU groups that autoscale from zero, the dashboard on localhost, token auth
    spec = doc["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["authOptions"] == {"mode": "token"}
    assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    assert spec["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] == group["replicas"] == 0 and group["maxReplicas"] >= 1, group["groupName"]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in group["template"]["spec"][
            "tolerations"], group["groupName"]


def test_kuberay_worker_groups_mirror_the_gpu_node_types_of_gpu_yaml():
    """Every GPU of the cluster in use: the groups offer what clusters/gpu.yaml's GPU node types offer, 1 GPU a pod
    (0-8 pods) and 8 GPUs a pod (0-2 pods), not only the 1-GPU pods of before."""
    config = _load(CLUSTERS / "gpu.yaml")
    launcher = sorted((int(t["resources"]["GPU"]), t["max_workers"]) for name, t in config["available_node_types"].items()
                      if name != config["head_node_type"])
    groups = _raycluster()["spec"]["workerGroupSpecs"]
    kuberay = sorted((_quantity(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]),
                      g["maxReplicas"]) for g in groups)
    assert kuberay == launcher == [(1, 8), (8, 2)], (kuberay, launcher)


def test_kuberay_checker_catches_a_broken_manifest():
    doc = _raycluster()
    bad = copy.deepcopy(doc)
    bad["spec"]["rayVersion"] = "2.59.0"
    del bad["spec"]["headGroupSpec"]["rayStartParams"]
    group = bad["spec"]["workerGroupSpecs"][0]
    group["minReplicas"], group["replicas"] = 2, 1
    del group["groupName"]
    del group["template"]["spec"]["containers"][0]["image"]
    bad["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] = "rayproject/ray:2.59.0-py311-gpu"
    assert raycluster_problems(bad, RAY_VERSION) == [
        f"spec.rayVersion: '2.59.0', the installed ray is {RAY_VERSION!r}",
        "spec.headGroupSpec.rayStartParams: missing (a map of `ray start` flags, may be empty)",
        "spec.headGroupSpec.template.spec.containers[0].image: rayproject/ray:2.59.0-py311-gpu has Ray "
        f"2.59.0, the installed ray is {RAY_VERSION}",
        "spec.workerGroupSpecs[0].groupName: missing",
        "spec.workerGroupSpecs[0]: needs minReplicas <= replicas <= maxReplicas, got 2 / 1 / 8",
        "spec.workerGroupSpecs[0].template.spec.containers[0].image: missing",
    ]


def test_kuberay_configmap_node_types_equal_the_worker_groups(ray_schema):
    """The node types raysent counts (RAYSENT_AUTOSCALING_CONFIG) are the RayCluster's groups: CPU and GPU from each
    Ray container's limits (the head's GPU from num-gpus), max_workers = maxReplicas; the head mounts the ConfigMap
    where its env var points; and raysent's own reader finds every GPU of every group in it."""
    from raysent.train.resources import AUTOSCALING_CONFIG_VAR, capacity_of_config  # torch, no ray

    doc = _raycluster()
    config = _autoscaling_config()
    key = config.pop("__key__")
    assert _schema_errors(config, ray_schema) == []  # an autoscaler config as Ray's schema has it
    spec = doc["spec"]
    head_limits = spec["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    expected = {config["head_node_type"]: {
        "min_workers": 0, "max_workers": 0,
        "resources": {"CPU": _quantity(head_limits["cpu"]),
                      "GPU": _quantity(spec["headGroupSpec"]["rayStartParams"]["num-gpus"])}}}
    for g in spec["workerGroupSpecs"]:
        limits = g["template"]["spec"]["containers"][0]["resources"]["limits"]
        expected[g["groupName"]] = {"min_workers": g["minReplicas"], "max_workers": g["maxReplicas"],
                                    "resources": {"CPU": _quantity(limits["cpu"]),
                                                  "GPU": _quantity(limits["nvidia.com/gpu"])}}
    got = {name: {k: t.get(k) for k in ("min_workers", "max_workers", "resources")}
           for name, t in config["available_node_types"].items()}
    assert got == expected
    assert config["max_workers"] == sum(g["maxReplicas"] for g in spec["workerGroupSpecs"])

    gpus = sum(_quantity(g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
               * g["maxReplicas"] for g in spec["workerGroupSpecs"])
    assert gpus == 1 * 8 + 8 * 2 == 24
    assert capacity_of_config(config)["GPU"] == gpus

    # mounted on the head, at the file the head's RAYSENT_AUTOSCALING_CONFIG names (the driver runs there)
    head = spec["headGroupSpec"]["template"]["spec"]
    path = Path(_env(head)[AUTOSCALING_CONFIG_VAR])
    assert path.name == key
    volume = _mounts(head)[str(path.parent)]
    assert volume["configMap"]["name"] == AUTOSCALING_MAP


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_kuberay_configmap_is_what_rays_kuberay_autoscaler_derives():
    """The ConfigMap holds what KubeRay's autoscaler itself makes of this RayCluster (Ray's own code for it:
    ray.autoscaler._private.kuberay.autoscaling_config), node type by node type, for the fields raysent reads."""
    from ray.autoscaler._private.kuberay.autoscaling_config import _derive_autoscaling_config_from_ray_cr

    cr = copy.deepcopy(_raycluster())
    cr["metadata"]["namespace"] = "default"  # the API server fills it in
    derived = _derive_autoscaling_config_from_ray_cr(cr)
    config = _autoscaling_config()

    def view(c):
        return {"head_node_type": c["head_node_type"], "max_workers": c["max_workers"],
                "types": {name: (t["min_workers"], t["max_workers"], t["resources"]["CPU"], t["resources"].get("GPU", 0))
                          for name, t in c["available_node_types"].items()}}

    assert view(config) == view(derived)


def test_kuberay_results_and_shared_claims_are_mounted_where_the_commands_write():
    """Results (and the sqlite MLflow store) on a ReadWriteOnce claim mounted on the head, where the Ray job's driver
    runs; checkpoints and the caches on a ReadWriteMany claim every pod mounts at the same path; no emptyDir for
    either."""
    path = CLUSTERS / "kuberay.yaml"
    results = _document(path, "PersistentVolumeClaim", RESULTS_CLAIM)
    shared = _document(path, "PersistentVolumeClaim", SHARED_CLAIM)
    assert results["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert shared["spec"]["accessModes"] == ["ReadWriteMany"]
    for claim in (results, shared):
        assert re.fullmatch(r"\d+Gi", claim["spec"]["resources"]["requests"]["storage"]), claim["metadata"]["name"]

    pods = _pods(_raycluster())
    (head,) = [pod for name, pod in pods if name == "head"]
    assert _claim_mount(head, RESULTS_CLAIM) is not None
    assert [name for name, pod in pods if _claim_mount(pod, RESULTS_CLAIM)] == ["head"], "RWO: the head alone"
    shared_at = {_claim_mount(pod, SHARED_CLAIM) for _, pod in pods}
    assert len(shared_at) == 1 and None not in shared_at, shared_at
    (shared_at,) = shared_at
    for name, pod in pods:
        env = _env(pod)
        for var in ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR", "HF_HOME"):
            assert env[var].startswith(shared_at + "/"), (name, var, env[var])
        mounted = {m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert mounted <= {v["name"] for v in pod["volumes"]}, name
        for where, volume in _mounts(pod).items():  # pod-local scratch only: Ray's logs, shared memory
            if "emptyDir" in volume:
                assert where in ("/tmp/ray", "/dev/shm"), (name, where)
        assert pod.get("securityContext", {}).get("fsGroup") == 100, f"{name}: the image's `ray` user is in gid 100"
    # the same paths in the manifest's own header commands
    text = path.read_text(encoding="utf-8")
    assert f"--set tracking.results_dir={_claim_mount(head, RESULTS_CLAIM)}" in text
    assert f"--set resources.storage_path={shared_at}/tune" in text


# --------------------------------------------------------------------------- the raysent image
def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, its arguments) in order: comments dropped, backslash continuations joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        word, _, rest = (pending + stripped).partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "a continuation at the end of the file"
    return out


def _simple_commands(command: str) -> list[list[str]]:
    """The words of each simple command in a shell line (split at ; && || |)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    out, words = [], []
    for token in list(lexer) + [";"]:
        if token and set(token) <= set(";&|"):
            if words:
                out.append(words)
            words = []
        else:
            words.append(token)
    return out


def _pip_installs(run: str) -> list[list[str]]:
    """The requirements (non-flag words) of each ``pip install`` in a RUN line."""
    return [[w for w in words[2:] if not w.startswith("-")] for words in _simple_commands(run)
            if words[:2] == ["pip", "install"]]


def _pyproject_requirement(name: str):
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    (req,) = [r for r in map(Requirement, project["dependencies"]) if r.name == name]
    return req, project["requires-python"]


def test_dockerfile_builds_on_the_installed_ray_and_installs_torch_before_the_project():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    steps = dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))
    froms = [args for op, args in steps if op == "FROM"]
    assert len(froms) == 1, froms
    m = re.fullmatch(r"rayproject/ray:(?P<version>\d+\.\d+\.\d+)-py(?P<py>3)(?P<minor>\d+)-gpu", froms[0])
    assert m, f"FROM {froms[0]}: not Ray's GPU image"
    assert m["version"] == RAY_VERSION, f"FROM {froms[0]}: the installed ray is {RAY_VERSION}"
    ray_req, requires_python = _pyproject_requirement("ray")
    assert SpecifierSet(requires_python).contains(f"{m['py']}.{m['minor']}"), (froms[0], requires_python)

    runs = [(i, args) for i, (op, args) in enumerate(steps) if op == "RUN"]
    installs = [(i, req) for i, run in runs for reqs in _pip_installs(run) for req in reqs]
    project_at = [i for i, req in installs if req == "."]
    installs = [(i, Requirement(req)) for i, req in installs if req != "."]  # the rest are requirements
    torch_at = [i for i, req in installs if req.name == "torch"]
    assert len(project_at) == 1, "the project is installed once, from the build context (`pip install .`)"
    assert torch_at and max(torch_at) < project_at[0], "torch before the project (which would pull the newest torch)"
    assert not any("-e" in words or "--editable" in words for _, run in runs for words in _simple_commands(run)), \
        "not editable: the image's raysent is its own, whatever the working directory"
    # torch: the CPU tests' version (the local build's tag dropped), within pyproject.toml's range
    torch_pins = {str(req.specifier) for _, req in installs if req.name == "torch"}
    installed_torch = importlib.metadata.version("torch").split("+")[0]
    assert torch_pins == {f"=={installed_torch}"}, torch_pins
    assert _pyproject_requirement("torch")[0].specifier.contains(installed_torch)
    # ray: pinned to the image's own, with pyproject.toml's extras
    ray_pins = [req for _, req in installs if req.name == "ray"]
    assert ray_pins and {str(r.specifier) for r in ray_pins} == {f"=={RAY_VERSION}"}, ray_pins
    assert all(r.extras == ray_req.extras for r in ray_pins), (ray_pins, ray_req)
    # `pip check` in the build, after the project's install
    checks = [i for i, run in runs if ["pip", "check"] in _simple_commands(run)]
    assert checks and max(checks) >= project_at[0], "`pip check` after the project is installed"
    # what the build reads is copied before the install
    copied_before = {src for i, (op, args) in enumerate(steps) if op == "COPY" and i < project_at[0]
                     for src in _copy_sources(args)}
    assert {"pyproject.toml", "README.md", "raysent"} <= copied_before, copied_before


def _copy_sources(args: str) -> list[str]:
    words = [w for w in shlex.split(args) if not w.startswith("--")]
    return [w.rstrip("/") for w in words[:-1]]


def _dockerignore_rules(text: str) -> list[tuple[bool, str, re.Pattern]]:
    """(negated, pattern, regex) of each line, as Docker reads them (moby's patternmatcher): ``*`` and ``?`` within
    one path element, ``**`` across elements, a leading ``!`` lets a path back in, leading/trailing ``/`` dropped."""
    rules = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = (line[1:] if negated else line).strip().strip("/")
        rx, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                rx, i = rx + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                rx, i = rx + ".*", i + 2
            elif pattern[i] == "*":
                rx, i = rx + "[^/]*", i + 1
            elif pattern[i] == "?":
                rx, i = rx + "[^/]", i + 1
            else:
                rx, i = rx + re.escape(pattern[i]), i + 1
        rules.append((negated, pattern, re.compile(rx)))
    return rules


def dockerignored(rules, rel: str) -> bool:
    """Whether Docker leaves ``rel`` (a path relative to the context) out: the last rule that matches it or one of
    its parent folders decides."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    out = False
    for negated, _, rx in rules:
        if any(rx.fullmatch(p) for p in prefixes):
            out = not negated
    return out


def build_context(rules) -> list[str]:
    """The files of the repository that ``docker build ... .`` sends (a folder left out is not walked unless a
    ``!`` rule reaches inside it)."""
    import os

    files = []
    for root, dirs, names in os.walk(REPO):
        rel_root = Path(root).relative_to(REPO).as_posix()
        rel_root = "" if rel_root == "." else rel_root + "/"
        dirs[:] = [d for d in dirs if not dockerignored(rules, rel_root + d)
                   or any(neg and pat.startswith(rel_root + d + "/") for neg, pat, _ in rules)]
        files += [rel_root + n for n in names if not dockerignored(rules, rel_root + n)]
    return sorted(files)


def test_dockerignore_sends_only_what_the_dockerfile_copies():
    """A lean image: the build context is the COPY sources of clusters/Dockerfile, no virtual environment, git
    metadata, generated results or byte code."""
    rules = _dockerignore_rules(DOCKERIGNORE.read_text(encoding="utf-8"))
    for path in (".venv/bin/python", ".git/HEAD", "results/quick/summary.json", "results/mlflow.db",
                 "results/mini/runs/x.json", "raysent.egg-info/PKG-INFO", "raysent/__pycache__/cli.cpython-311.pyc",
                 "raysent/cli/__pycache__", "mlruns/0/meta.yaml", "tests/conftest.py", "docs/cluster.md"):
        assert dockerignored(rules, path), f"{path} would be in the build context"
    steps = dockerfile_instructions(DOCKERFILE.read_text(encoding="utf-8"))
    sources = [src for op, args in steps if op == "COPY" for src in _copy_sources(args)]
    context = build_context(rules)
    for src in sources:
        assert any(f == src or f.startswith(src + "/") for f in context), f"COPY {src}: not in the build context"
    stray = [f for f in context if not any(f == s or f.startswith(s + "/") for s in sources)]
    assert stray == [], f"sent to Docker but never copied: {stray}"
    assert "raysent/cli/__init__.py" in context and "results/published.yaml" in context
    size = sum((REPO / f).stat().st_size for f in context)
    assert size < 20 * 2**20, f"build context of {size / 2**20:.1f} MiB"


def test_dockerignore_matcher_follows_dockers_rules():
    rules = _dockerignore_rules("*\n!keep/\n**/__pycache__\n!results/published.yaml\n")
    assert dockerignored(rules, "other.txt") and dockerignored(rules, "results/quick/x.json")
    assert not dockerignored(rules, "keep/a/b.py") and dockerignored(rules, "keep/a/__pycache__/b.pyc")
    assert not dockerignored(rules, "results/published.yaml")


# --------------------------------------------------------------------------- the pinned Ray version
_PIP_RAY = re.compile(r"\bray(?:\[[^\]]*\])?==(?P<version>[0-9][0-9A-Za-z.+]*)")


@pytest.mark.parametrize("path", LAUNCHER_FILES, ids=lambda p: p.name)
def test_launcher_config_pins_the_installed_ray(path):
    config = _load(path)
    pins = [m["version"] for key in COMMAND_KEYS for c in config.get(key) or [] for m in _PIP_RAY.finditer(c)]
    assert pins, f"{path.name}: no `pip install ray==X` in the setup commands"
    assert set(pins) == {RAY_VERSION}, (
        f"{path.name} installs ray {sorted(set(pins))} on the nodes but ray {RAY_VERSION} is installed "
        "here: update the cluster configs (the nodes must run the ray that launches them)")


def _raysent_release() -> str:
    """raysent's version without a pre-release or dev suffix (0.2.0 for 0.2.0.dev0), read without importing it."""
    from packaging.version import Version

    text = (REPO / "raysent" / "__init__.py").read_text(encoding="utf-8")
    return Version(re.search(r'^__version__ = "([^"]+)"', text, flags=re.M)[1]).base_version


def test_kuberay_manifest_pins_the_installed_ray_and_runs_the_raysent_image():
    doc = _raycluster()
    assert doc["spec"]["rayVersion"] == RAY_VERSION
    images = {c["image"] for _, pod in _pods(doc) for c in pod["containers"]}
    # one image everywhere: the one clusters/Dockerfile builds, its tag naming the Ray inside
    assert len(images) == 1, images
    (image,) = images
    m = re.fullmatch(rf"REGISTRY/raysent:(?P<version>\d+\.\d+\.\d+)-ray{re.escape(RAY_VERSION)}", image)
    assert m, image
    assert m["version"] == _raysent_release(), f"{image}: raysent is {_raysent_release()}"
    assert not _RAY_IMAGE.match(image), "the stock image has neither raysent nor torch"
    # the base image the comments name is the Dockerfile's
    text = (CLUSTERS / "kuberay.yaml").read_text(encoding="utf-8")
    assert set(re.findall(r"rayproject/ray:(\d+\.\d+\.\d+)", text)) == {RAY_VERSION}
    assert f"docker build -f clusters/Dockerfile -t {image} ." in text
    assert f"docker build -f clusters/Dockerfile -t {image} ." in DOCKERFILE.read_text(encoding="utf-8")


def test_readme_names_the_installed_ray_version():
    section = _readme_section()
    pins = set(_PIP_RAY.findall(section)) | set(re.findall(r"Ray you run the commands with \(([\d.]+) now\)", section))
    assert pins == {RAY_VERSION}, pins


# --------------------------------------------------------------------------- ray CLI lines
def _readme_section() -> str:
    text = README.read_text(encoding="utf-8")
    assert README_SECTION in text, f"docs/cluster.md has no section {README_SECTION!r}"
    section = text.split(README_SECTION, 1)[1]
    return section.split("\n## ", 1)[0]


def _code_lines(markdown: str) -> list[str]:
    """Lines of the fenced code blocks, backslash continuations joined."""
    lines: list[str] = []
    for block in re.findall(r"^```[^\n]*\n(.*?)^```", markdown, flags=re.S | re.M):
        pending = ""
        for line in block.splitlines():
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            lines.append((pending + line).strip())
            pending = ""
    return [line for line in lines if line]


def _ray_invocations(command: str) -> list[list[str]]:
    """The ``ray ...`` words of each simple command in a shell line (split at ; && || |)."""
    out = []
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    words: list[str] = []
    for token in list(lexer) + [";"]:
        if token and set(token) <= set(";&|"):
            if words and words[0] == "ray":
                out.append(words)
            words = []
        else:
            words.append(token)
    return out


@pytest.fixture(scope="module")
def ray_cli():
    from ray.scripts.scripts import cli

    return cli


def ray_line_problems(words: list[str], cli: click.Group) -> list[str]:
    """An empty list when ``ray <sub> ...`` names a subcommand that exists and only flags its
    ``--help`` lists. Flags after a bare ``--`` belong to the command that ray runs, not to ray."""
    assert words[0] == "ray"
    line = " ".join(words)
    command, path, i = cli, [], 1
    while isinstance(command, click.Group):
        if i >= len(words) or words[i].startswith("-"):
            return [f"{line}: `ray {' '.join(path)}` needs a subcommand"]
        sub = command.commands.get(words[i])
        if sub is None:
            return [f"{line}: `ray {' '.join(path + [words[i]])}`: no such subcommand"]
        command, path, i = sub, path + [words[i]], i + 1
    result = CliRunner().invoke(cli, [*path, "--help"], prog_name="ray")
    if result.exit_code != 0:
        return [f"{line}: `ray {' '.join(path)} --help` failed: {result.output}"]
    problems = []
    for word in words[i:]:
        if word == "--":
            break
        if word.startswith("-") and len(word) > 1:
            flag = word.split("=", 1)[0]
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", result.output):
                problems.append(f"{line}: `ray {' '.join(path)}` has no flag {flag}")
    return problems


def test_readme_cluster_section_lists_the_commands_in_order():
    section = _readme_section()
    lines = _code_lines(section)
    ray_lines = [line for line in lines if line.startswith("ray ")]
    assert ray_lines[:2] == ["ray get-auth-token --generate > /dev/null", "ray up clusters/gpu.yaml --yes"], ray_lines
    gpu = [i for i, line in enumerate(ray_lines) if "clusters/gpu.yaml" in line]
    assert ray_lines[gpu[-1]] == "ray down clusters/gpu.yaml --yes", "ray down comes after every other gpu.yaml command"
    joined = "\n".join(lines)
    for needed in ("ray dashboard clusters/gpu.yaml", "ray rsync-up clusters/gpu.yaml", "ray attach clusters/gpu.yaml -p 5000",
                   "ray exec clusters/gpu.yaml", "-L 5000:127.0.0.1:5000",
                   "ray job submit --address http://127.0.0.1:8265 --working-dir . -- raysent tune "
                   "search_spaces/sgopt.yaml --address auto",
                   "--address ray://127.0.0.1:10001", "storage_path: s3://", "mlflow_uri:",
                   "kubectl apply -f clusters/kuberay.yaml", "kubectl port-forward", "kubectl delete -f clusters/kuberay.yaml",
                   "chmod 600 ~/.ray/auth_token", "export RAY_AUTH_MODE=token"):
        assert needed in joined, f"README cluster section lacks {needed!r}"
    for needed in ("RAYSENT_DATA_DIR", "RAYSENT_MODEL_DIR", "MLFLOW_TRACKING_URI", "RAY_ADDRESS"):
        assert needed in section, f"README cluster section does not mention {needed}"
    for name in set(re.findall(r"clusters/[\w.-]+\.yaml", section)):
        assert (REPO / name).is_file(), f"README names {name}, which does not exist"
    for name in set(re.findall(r"search_spaces/[\w.-]+\.yaml", section)):
        assert (REPO / name).is_file(), f"README names {name}, which does not exist"


KUBERAY_DOCS = "**Kubernetes (KubeRay).**"


def _kuberay_section() -> str:
    section = _readme_section()
    assert section.count(KUBERAY_DOCS) == 1, f"docs/cluster.md has no paragraph {KUBERAY_DOCS!r}"
    return section.split(KUBERAY_DOCS, 1)[1]


def _set_values(words: list[str]) -> dict[str, str]:
    """``--set key=value`` pairs of a command's words."""
    return dict(words[i + 1].split("=", 1) for i, w in enumerate(words[:-1]) if w == "--set")


def test_kuberay_docs_commands_run_in_order_and_name_the_manifests_paths():
    """The KubeRay commands a user runs, in order, name the image the manifest runs, the head's results mount, the
    shared mount every pod has, and the cluster's names (its head service, token Secret, pod labels)."""
    section = _kuberay_section()
    lines = _code_lines(section)
    doc = _raycluster()
    name = doc["metadata"]["name"]
    (image,) = {c["image"] for _, pod in _pods(doc) for c in pod["containers"]}
    pods = dict(_pods(doc))
    results_at, shared_at = _claim_mount(pods["head"], RESULTS_CLAIM), _claim_mount(pods["head"], SHARED_CLAIM)

    def first(prefix: str) -> int:
        found = [i for i, line in enumerate(lines) if line.startswith(prefix)]
        assert found, f"the KubeRay part of docs/cluster.md has no `{prefix} ...` line: {lines}"
        return found[0]

    order = [first(f"docker build -f clusters/Dockerfile -t {image} ."), first(f"docker push {image}"),
             first("kubectl apply -f clusters/kuberay.yaml"), first(f"kubectl port-forward service/{name}-head-svc "),
             first("export RAY_AUTH_TOKEN="), first("ray job submit "), first("kubectl cp "),
             first(f"kubectl delete raycluster {name}"), first("kubectl delete -f clusters/kuberay.yaml")]
    assert order == sorted(order), [lines[i] for i in order]
    assert lines[first("kubectl delete -f clusters/kuberay.yaml")] == "kubectl delete -f clusters/kuberay.yaml"

    # the job: the head's results mount and the shared mount, as the manifest has them
    (submit,) = [line for line in lines if line.startswith("ray job submit ")]
    (words,) = _ray_invocations(submit)
    entry = words[words.index("--") + 1:]
    assert entry[:3] == ["raysent", "tune", "search_spaces/sgopt.yaml"] and "--address" in entry, entry
    assert entry[entry.index("--address") + 1] == "auto"
    sets = _set_values(entry)
    assert sets["tracking.results_dir"] == results_at, (sets, results_at)
    assert sets["resources.storage_path"].startswith(shared_at + "/"), (sets, shared_at)
    # the cluster starts with its head alone: the MLflow server must be up before the first GPU pod joins
    assert sets["tracking.server"] == "always"
    assert words[words.index("--address") + 1] == "http://127.0.0.1:8265"

    # the results are fetched from where the driver wrote them, from the pod the labels pick
    head_mounts = set(_mounts(pods["head"]))
    for line in lines:
        if line.startswith("kubectl cp "):
            remote = [w.split(":", 1)[1] for w in shlex.split(line)[2:] if w.startswith("$HEAD:")]
            assert remote and all(any(r == m or r.startswith(m + "/") for m in head_mounts) for r in remote), line
    assert any(f"$HEAD:{results_at}" in line for line in lines if line.startswith("kubectl cp ")), "fetch the results"
    assert f"-l ray.io/cluster={name},ray.io/node-type=head" in section
    assert f"kubectl get secret {name} " in section
    for path in set(re.findall(r"`(/home/ray/[\w/.-]+)`", section)):  # every path the prose names exists there
        assert any(path == m or path.startswith(m + "/") for m in head_mounts | {"/etc/raysent"}), path
    for placeholder in ("REGISTRY", "RWX_STORAGE_CLASS"):
        assert placeholder in section and placeholder in (CLUSTERS / "kuberay.yaml").read_text(encoding="utf-8")
    # how many GPUs a search uses, as the manifest has them
    assert "24 GPUs" in section and "RAYSENT_AUTOSCALING_CONFIG" in section
    for line in lines:
        for f in re.findall(r"(?:-f|--file) (\S+)", line):
            assert (REPO / f).is_file(), line


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_docs_say_from_where_each_port_of_the_cluster_must_be_reachable():
    """docs/cluster.md's port table names every port clusters/gpu.yaml starts Ray with, and Ray's worker port
    range, and says who may reach each: the cluster's own nodes, or you through SSH."""
    from ray.scripts.scripts import start

    rows = dict(re.findall(r"^\| (\d[\d-]*) \| [^|]+ \| ([^|]+) \|$", _readme_section(), flags=re.M))
    config = _load(CLUSTERS / "gpu.yaml")
    ports = {value for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in config[key]
             for flag, value in _start_command_flags(c, "start").items() if flag.endswith("-port") and value}
    assert ports == {"6379", "8076", "8265", "10001"}
    defaults = {p.name: p.default for p in start.params}
    workers = f"{defaults['min_worker_port']}-{defaults['max_worker_port']}"
    assert set(rows) == ports | {"22", workers, "5000"}, rows
    for port in ("6379", "8076", workers):
        assert rows[port].strip() == "the cluster's nodes only"
    assert rows["10001"].startswith("the cluster's nodes; your machine only through SSH")
    assert rows["8265"].startswith("no other machine: your machine through SSH (`ray dashboard clusters/gpu.yaml`)")
    assert rows["22"].startswith("your machine")


def _nested_ray_invocations(line: str) -> list[list[str]]:
    """``ray`` commands inside a line: in ``$(ray ...)``, and in the quoted command of ``ray exec``."""
    found = [w for sub in re.findall(r"\$\((ray [^)]*)\)", line) for w in _ray_invocations(sub)]
    for words in _ray_invocations(line) if line.startswith("ray ") else []:
        if words[1:2] == ["exec"]:
            found += [w for arg in words[2:] if " " in arg for w in _ray_invocations(arg)]
    return found


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_readme_ray_commands_exist_with_their_flags(ray_cli):
    code = _code_lines(_readme_section())
    lines = [line for line in code if line.startswith("ray ")]
    assert len(lines) >= 10, lines
    invocations = [words for line in lines for words in _ray_invocations(line)]
    nested = [words for line in code for words in _nested_ray_invocations(line)]
    assert ["ray", "status"] in nested and ["ray", "get-head-ip", "clusters/gpu.yaml"] in nested, nested
    problems = [p for words in invocations + nested for p in ray_line_problems(words, ray_cli)]
    assert problems == []


@pytest.mark.slow  # runs ray's own code (imports ray)
@pytest.mark.parametrize("path", LAUNCHER_FILES, ids=lambda p: p.name)
def test_config_ray_commands_exist_with_their_flags(path, ray_cli):
    config = _load(path)
    invocations = [words for key in COMMAND_KEYS for c in config.get(key) or [] for words in _ray_invocations(c)]
    assert any(w[1:2] == ["start"] for w in invocations)
    problems = [p for words in invocations for p in ray_line_problems(words, ray_cli)]
    assert problems == []


@pytest.mark.slow  # runs ray's own code (imports ray)
def test_ray_line_checker_catches_a_wrong_subcommand_or_flag(ray_cli):
    def check(line):
        (words,) = _ray_invocations(line)
        return ray_line_problems(words, ray_cli)

    assert check("ray upp clusters/gpu.yaml") == ["ray upp clusters/gpu.yaml: `ray upp`: no such subcommand"]
    assert check("ray up clusters/gpu.yaml --max-worker 3") == [
        "ray up clusters/gpu.yaml --max-worker 3: `ray up` has no flag --max-worker"]
    assert check("ray job clusters/gpu.yaml") == [
        "ray job clusters/gpu.yaml: `ray job clusters/gpu.yaml`: no such subcommand"]
    assert check("ray job --address http://127.0.0.1:8265") == [
        "ray job --address http://127.0.0.1:8265: `ray job` needs a subcommand"]
    # flags after `--` are the entrypoint's, and a flag's value may follow `=`
    assert check("ray job submit --address=http://127.0.0.1:8265 -- raysent tune X --bogus") == []

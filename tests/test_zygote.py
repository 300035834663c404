"""The tests' warm starter (tests/zygote.py, conftest.WarmStarter): a command or a block run through it gives what a
fresh process gives (exit status, output, folder, environment, its own random numbers), a timeout ends it, a setting
read at import that differs sends it to a fresh process, and the session Ray's workers are forked from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, WarmStarter

pytestmark = pytest.mark.slow  # the starter imports torch and transformers (~10 s)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    starter = WarmStarter(tmp_path_factory.mktemp("warm")).start()
    assert starter.up(wait=120), (starter.folder / "warm.log").read_text()
    yield starter
    starter.stop()


def fresh(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raysent.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env=env or dict(os.environ))


@pytest.mark.parametrize("args", [["methods", "--format", "json"], ["tune", "missing.yaml"], ["export", "--help"]],
                         ids=["json", "an error", "help"])
def test_a_command_gives_what_a_fresh_process_gives(warm, args):
    got = warm.run("cli", {"argv": args}, REPO, dict(os.environ), False, 60)
    want = fresh(*args)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    assert got.returncode == (2 if args[0] == "tune" else 0)


def test_code_runs_in_its_folder_with_its_environment_and_its_own_random_numbers(warm, tmp_path):
    code = ("import json, os, random, sys\n"
            "print(json.dumps([os.getcwd(), os.environ.get('RAYSENT_X'), sys.argv, random.random()]))\n"
            "print('to stderr', file=sys.stderr)\n"
            "sys.exit(int(os.environ['RAYSENT_X']))\n")
    env = {**os.environ, "RAYSENT_X": "3"}
    runs = [warm.run("code", {"code": code}, tmp_path, env, False, 60) for _ in range(2)]
    for r in runs:
        cwd, x, argv, _ = json.loads(r.stdout)
        assert (r.returncode, cwd, x, argv, r.stderr) == (3, str(tmp_path), "3", ["-c"], "to stderr\n")
    assert json.loads(runs[0].stdout)[3] != json.loads(runs[1].stdout)[3]  # reseeded in each child
    for failing in ("import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise ValueError('x')",
                    "import sys\nsys.exit('bye')"):
        both = warm.run("code", {"code": failing}, tmp_path, env, True, 60)
        want = subprocess.run([sys.executable, "-c", failing], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=tmp_path, env=env)
        # stderr line by line and stdout's buffer at the end, the traceback from the code on, a message passed to
        # sys.exit printed: as from a fresh process
        assert (both.returncode, both.stdout) == (want.returncode, want.stdout) == (1, want.stdout)
        assert ("ValueError: x" in both.stdout) if "ValueError" in failing else both.stdout == "bye\n"


def test_a_timeout_ends_the_command_and_the_starter_goes_on(warm, tmp_path):
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run("code", {"code": "import time\ntime.sleep(60)"}, tmp_path, dict(os.environ), False, 1)
    assert warm.run("code", {"code": "print(1)"}, tmp_path, dict(os.environ), False, 60).stdout == "1\n"


def test_a_setting_read_at_import_that_differs_sends_the_command_to_a_fresh_process(warm, tmp_path):
    threads = str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)
    assert warm.run("code", {"code": "print(1)"}, tmp_path, {**os.environ, "OMP_NUM_THREADS": threads}, False, 60) \
        is None


def test_the_shim_on_a_blocks_path_is_the_raysent_command(warm):
    env = {**os.environ, "PATH": os.pathsep.join([str(warm.folder / "bin"), os.environ["PATH"]])}
    got = subprocess.run(["bash", "-c", "raysent methods --format json; raysent tune missing.yaml"], cwd=REPO,
                         env=env, capture_output=True, text=True)
    want = fresh("methods", "--format", "json")
    assert got.returncode == 2 and got.stdout == want.stdout and "missing.yaml: file not found" in got.stderr


def test_the_session_rays_workers_are_forked_warm(ray_cluster):
    import ray

    from conftest import _WARM

    if "ray" not in _WARM:
        pytest.skip("the session's Ray has no warm starter (RAYSENT_TEST_WARM=0, or a cluster in RAY_ADDRESS)")
    _WARM["ray"].up(wait=120)

    # a runtime environment of its own: a worker started for it now, not an idle one started before the starter was up
    env = {"py_executable": _WARM["ray"].worker_command, "env_vars": {"RAYSENT_TEST_FORKED": "1"}}

    @ray.remote(num_cpus=0.1, runtime_env=env)
    def where() -> tuple[int, bool, str]:
        return os.getppid(), "torch" in sys.modules, ray.get_runtime_context().get_job_id()

    parent, warm_imports, job = ray.get(where.remote())
    assert parent == _WARM["ray"].proc.pid and warm_imports and job == ray.get_runtime_context().get_job_id()

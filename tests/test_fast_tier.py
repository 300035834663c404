"""The fast tier's guard (tests/conftest.py, tests/fast_tier): a test not marked slow that trains or imports
ray fails, saying so, and so does one whose processes do, or a test module that imports ray as it is collected.
A stand-in module named ``ray`` plays Ray here: nothing real is imported or trained."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import FAST_TIER, REPO, guard

pytest_plugins = ["pytester"]


def fake_ray(folder) -> str:
    """A folder holding an empty package named ray, for PYTHONPATH."""
    (folder / "ray").mkdir(parents=True)
    (folder / "ray" / "__init__.py").write_text("")
    return str(folder)


def test_the_training_loop_fails_a_fast_test_at_once():
    from raysent.train import loop, run

    # wrapped where every run enters: the loop's module, the name run.py bound, an optimizer step
    for entry in (loop.run_training, run.run_training, loop.Stepper.step):
        assert hasattr(entry, "__wrapped__"), entry
    with pytest.raises(pytest.fail.Exception, match="is not marked slow but trains"):
        run.run_training(None, None, None, [], None)


def test_a_process_a_fast_test_starts_reports_that_it_imported_ray(tmp_path):
    report = tmp_path / "report.jsonl"
    env = {**os.environ, guard.REPORT_ENV: str(report),
           "PYTHONPATH": os.pathsep.join([os.environ["PYTHONPATH"], fake_ray(tmp_path / "fake")])}
    assert os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(FAST_TIER)
    subprocess.run([sys.executable, "-c", "import json"], env=env, check=True)
    assert not report.exists()  # nothing to say
    subprocess.run([sys.executable, "-c", "import ray"], env=env, check=True)
    seen = json.loads(report.read_text())
    assert seen["ray"] == ["ray"] and seen["trained"] == [] and seen["argv"] == ["-c"]


def test_a_session_fails_the_fast_tests_that_break_the_promise_and_only_those(pytester, monkeypatch, tmp_path):
    shutil.copy(REPO / "tests" / "conftest.py", pytester.path / "conftest.py")
    shutil.copytree(FAST_TIER, pytester.path / "fast_tier")
    pytester.makeini("[pytest]\nmarkers =\n    slow: x\n    shared: y\n")
    fake = fake_ray(tmp_path / "fake")
    pytester.makepyfile(test_some=f"""
        import os, subprocess, sys, types
        import pytest

        def test_imports_ray():
            sys.modules["ray"] = types.ModuleType("ray")

        @pytest.mark.slow
        def test_slow_imports_ray():
            sys.modules["ray"] = types.ModuleType("ray")

        def test_starts_a_process_that_imports_ray(monkeypatch):
            monkeypatch.setenv("PYTHONPATH", os.environ["PYTHONPATH"] + os.pathsep + {fake!r})
            subprocess.run([sys.executable, "-c", "import ray"], check=True)

        def test_innocent():
            pass
        """)
    pytester.makepyfile(test_collected="import sys, types\nsys.modules['ray'] = types.ModuleType('ray')\n")
    # the session's own guard is not the inner session's
    monkeypatch.delenv(guard.REPORT_ENV)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in os.environ["PYTHONPATH"].split(os.pathsep)
                                                     if p != str(FAST_TIER)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_some.py")
    result.assert_outcomes(passed=2, failed=2)
    out = result.stdout.str()
    assert "test_some.py::test_imports_ray is not marked slow, but it imports ray." in out
    assert "test_starts_a_process_that_imports_ray is not marked slow, but it starts a process that imports " \
           "ray (ray, ...): -c" in out
    # a module that imports ray as it is collected (and so hides every later import) is an error by itself
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_collected.py")
    result.assert_outcomes(errors=1)
    assert "test_collected.py imports ray as it is collected" in result.stdout.str()

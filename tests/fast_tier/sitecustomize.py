"""The fast tier's guard: a test not marked ``slow`` neither trains nor imports Ray (tests/conftest.py).

conftest.py loads this file into the test process, and puts this folder first on PYTHONPATH while a fast test
runs, so Python imports it as ``sitecustomize`` at the start of every process such a test starts (a ``raysent``
command among them). In those processes it appends what broke the promise to the file named by
RAYSENT_FAST_TIER_REPORT, one JSON line per process, which conftest.py reads after the test. It imports only the
standard library: a process that imports nothing else stays that way.
"""

from __future__ import annotations

import atexit
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable

REPORT_ENV = "RAYSENT_FAST_TIER_REPORT"
LOOP = "raysent.train.loop"


def ray_modules() -> set[str]:
    return {m for m in sys.modules if m == "ray" or m.startswith("ray.")}


def _wrap(module, on_train: Callable[[str], None]) -> None:
    """Call ``on_train`` whenever the training loop of ``module`` (raysent.train.loop) is entered: run_training
    (every run, in process, in a trial, on a Ray Train worker) and Stepper.step (an optimizer step, bench's too)."""
    run_training, step = module.run_training, module.Stepper.step

    def guarded_run_training(*args, **kwargs):
        on_train("raysent.train.loop.run_training")
        return run_training(*args, **kwargs)

    def guarded_step(self, *args, **kwargs):
        on_train("raysent.train.loop.Stepper.step")
        return step(self, *args, **kwargs)

    guarded_run_training.__wrapped__ = run_training
    guarded_step.__wrapped__ = step
    module.run_training, module.Stepper.step = guarded_run_training, guarded_step


class _WatchLoop:
    """Wraps the loop's entry points as the loop's module is imported, before any other module imports them
    (``from raysent.train.loop import run_training`` then binds the wrapper)."""

    def __init__(self, on_train: Callable[[str], None]):
        self.on_train = on_train

    def find_spec(self, name, path=None, target=None):
        if name != LOOP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module, self.on_train)

        spec.loader.exec_module = exec_and_wrap
        return spec


def watch_training(on_train: Callable[[str], None]) -> None:
    """Call ``on_train(entry point)`` whenever this process enters the training loop."""
    if LOOP in sys.modules:
        _wrap(sys.modules[LOOP], on_train)
    else:
        sys.meta_path.insert(0, _WatchLoop(on_train))


def _in_a_started_process(report: str) -> None:
    trained: list[str] = []

    def write() -> None:
        ray = sorted(ray_modules())
        if ray or trained:
            with open(report, "a") as f:
                f.write(json.dumps({"argv": sys.argv, "pid": os.getpid(), "trained": trained,
                                    "ray": ray[:3]}) + "\n")

    def on_train(what: str) -> None:
        if not trained:
            trained.append(what)
            write()  # now: a process that dies training may never reach its atexit
        raise RuntimeError(f"{what}: a test not marked slow trains (tests/fast_tier)")

    watch_training(on_train)
    atexit.register(write)


if os.environ.get(REPORT_ENV) and __name__ == "sitecustomize":
    _in_a_started_process(os.environ[REPORT_ENV])

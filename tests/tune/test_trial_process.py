"""A trial's process ends quietly when Ray ends it: Ray's SIGTERM handler raises SystemExit wherever the process
is, and inside a garbage-collection callback Python prints "Exception ignored … SystemExit: 1" (the README's main
job printed it). raysent.tune.trial.quiet_exit, the trial's unraisable hook, drops exactly that."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import gc, sys, weakref
{hook}
class Thing:
    pass
def callback(_):
    raise {error}
thing = Thing()
ref = weakref.ref(thing, callback)
del thing
gc.collect()
"""


def run(hook: str, error: str) -> str:
    code = SCRIPT.format(hook=hook, error=error)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stderr


def test_a_system_exit_in_a_callback_is_silent_and_other_errors_are_not():
    hook = "from raysent.tune.trial import quiet_exit; sys.unraisablehook = quiet_exit"
    assert "Exception ignored" in run("", "SystemExit(1)")  # what Python does by itself
    assert run(hook, "SystemExit(1)") == ""
    said = run(hook, "ValueError('a real bug')")
    assert "Exception ignored" in said and "ValueError: a real bug" in said


def test_the_summary_says_diverged_where_it_prints_the_numbers():
    from raysent.report.summary import format_summary
    from raysent.tune.state import ArmOutcome, ScoreStat, Summary

    scores = {f"sts/{t}": ScoreStat(mean=10.0, std=1.0, n=2)
              for t in ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "avg")}
    arm = ArmOutcome(seeds=[1, 2], scores=scores, diverged_seeds=[2])
    text = format_summary(Summary(experiment="x", search="s", results="/r", final=arm,
                                  paper=arm.model_copy(update={"diverged_seeds": []}), warm_source="paper"))
    row = next(line for line in text.splitlines() if line.lstrip().startswith("searched"))
    assert "searched [DIVERGED 1/2]" in row and "10.00±1.00" in row
    assert "DIVERGED on seed(s) [2]" in text
    assert next(line for line in text.splitlines() if line.lstrip().startswith("paper ")).count("10.00±1.00") == 8  # 7 sets and Avg


def test_the_seeds_of_a_searched_configuration_never_repeat():
    """`seeds: [43]` with train.seed 42 and search.seeds 2 gave [43, 43]: one (configuration, seed) trained twice."""
    from raysent.config import parse_config
    from raysent.tune.trial import search_seeds

    def seeds(listed, seed, n):
        return search_seeds(parse_config({"name": "x", "method": "simcse-unsup", "model": {"name": "m"},
                                          "seeds": listed, "train": {"seed": seed},
                                          "search": {"seeds": n, "space": {"lr": {"type": "choice", "values": [1]}}}}))

    assert seeds([43], 42, 2) == [43, 44]
    assert seeds([1], 42, 2) == [1, 43] and seeds([1, 2, 3], 42, 5) == [1, 2, 3, 45, 46]  # as before

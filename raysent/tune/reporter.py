"""Where a trial's results go (issue 62, "A reporter seam"): to Ray Tune in a search, to a list in a test.

A trial (:func:`raysent.tune.trial.run_trial`, :func:`raysent.tune.seeds.run_seeds`) and the loop's hooks inside it
tell a :class:`Reporter` who they are (``trial_id``) and what they report (a
:class:`~raysent.tune.protocol.TrialResult`). :class:`TuneReporter` is the search's, and the one module of trial code
that calls ``ray.tune``; :class:`MemoryReporter` keeps the results in memory, each passed through the wire format
Tune would carry (``to_tune`` then ``from_tune``), so the trial code (resume, seeds in turns, records, the reuse of
search runs, MLflow logging) runs and is tested in the test's own process, without Ray.
"""

from __future__ import annotations

from typing import Protocol

from raysent.tune.protocol import TrialResult

# Lazy imports: ray (heavy, and only TuneReporter's methods need it: a trial's process has started Ray's worker).


class Reporter(Protocol):
    """What trial code needs of Tune."""

    @property
    def trial_id(self) -> str: ...

    def report(self, result: TrialResult) -> None: ...


class TuneReporter:
    """The trial's Ray Tune session: its trial id, and ``tune.report`` (which ends the trial's thread when the
    scheduler stopped it)."""

    @property
    def trial_id(self) -> str:
        from ray import tune

        return tune.get_context().get_trial_id()

    def report(self, result: TrialResult) -> None:
        from ray import tune

        tune.report(result.to_tune())


class MemoryReporter:
    """Results kept in order (``results``), as the driver would read them back (tests; no Ray)."""

    def __init__(self, trial_id: str = "t1"):
        self._trial_id = trial_id
        self.results: list[TrialResult] = []

    @property
    def trial_id(self) -> str:
        return self._trial_id

    def report(self, result: TrialResult) -> None:
        self.results.append(TrialResult.from_tune(result.to_tune()))

    @property
    def last(self) -> TrialResult:
        return self.results[-1]

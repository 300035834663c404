"""A trial's live MLflow run when it trains on Ray Train workers: rank 0's reports, as Ray Train's
controller receives them, logged to the run (:class:`raysent.tracking.LiveRun`) at their step."""

from __future__ import annotations

from ray.train import UserCallback

from raysent.tune.protocol import TrialResult


class MlflowReportCallback(UserCallback):
    def __init__(self, live):
        self.live = live  # a LiveRun: the tracking URI and the run's id (picklable)

    def after_report(self, run_context, metrics, checkpoint) -> None:
        result = TrialResult.from_loop(metrics[0] if metrics else {})
        if (step := result.logged_step) is not None:
            self.live.log(result.metrics, step)

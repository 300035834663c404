"""Stop a search whose first trials all fail the same way (``search.fail_fast``).

The checks before a search (:mod:`raysent.preflight`) catch what can be seen without training; what shows
only in a trial (a loss that raises, memory that runs out) would otherwise fail every trial of the search,
each with its own traceback. Tune's ``FailureConfig(fail_fast=True)`` stops at the first error, which also
ends a search whose one unlucky configuration diverged; this stops when the first N trials to end all
failed with the same error type, and the driver then raises that one error.
"""

from __future__ import annotations

import os

from ray.tune import Callback, Stopper

# Lazy imports: cloudpickle (heavy, and only the functions that need them import them).


def describe(error: BaseException | None) -> tuple[str, str]:
    """(type name, last line of the message) of a trial's error, the original one under Ray's wrappers (a Ray
    error's ``cause``)."""
    while error is not None and isinstance(cause := getattr(error, "cause", None), BaseException) \
            and cause is not error:
        error = cause
    if error is None:
        return "unknown", "no error recorded"
    lines = [ln for ln in str(error).strip().splitlines() if ln.strip()]
    return type(error).__name__, (lines[-1] if lines else "")[:1000]


def _error_of(trial) -> BaseException | None:
    """The trial's exception: Tune has just pickled it into the trial's local folder (its copy in the
    storage comes later)."""
    import cloudpickle

    try:
        local = getattr(trial, "pickled_error_file", None)
        if local and os.path.isfile(local):
            with open(local, "rb") as f:
                return cloudpickle.load(f)
        return trial.get_pickled_error() or trial.get_error()
    except Exception:  # an unreadable error file is still a failure
        return None


class FailFast(Callback, Stopper):
    """A Tune callback (it sees trials end) and stopper (it ends the experiment), given to both."""

    def __init__(self, n: int):
        self.n = n
        self.outcomes: list[tuple[str, str] | None] = []  # in the order trials ended; None: finished
        self.reason: tuple[str, str] | None = None

    # Callback
    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.outcomes.append(None)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.outcomes.append(describe(_error_of(trial)))
        failures = [o for o in self.outcomes[: self.n] if o is not None]  # of the first n trials to end
        if self.n and len(failures) == self.n and len({kind for kind, _ in failures}) == 1:
            self.reason = failures[-1]

    # Stopper
    def __call__(self, trial_id, result) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.reason is not None

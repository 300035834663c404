"""User-facing errors.

Every error a user can cause (a bad config, a malformed data file, a missing model) is a
:class:`RaysentError`. The command line prints its message and exits with status 2, never a
traceback from deep inside a library. The message says what was wrong, where (file, line,
field) and what is allowed.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from contextvars import ContextVar
from typing import Literal

# Which door the user came in by: the advice in an error names what that user types. The command line's main sets
# "cli" while a command runs; everything else is Python (a notebook, a script, raysent.load / fit / search).
DOOR: ContextVar[Literal["cli", "python"]] = ContextVar("raysent_door", default="python")


class RaysentError(Exception):
    """An error caused by the user's input, with a message meant to be read by that user."""


class ConfigError(RaysentError):
    """An experiment YAML that does not validate."""


class DataError(RaysentError):
    """A data set that cannot be found or read."""


class ModelError(RaysentError):
    """A model that cannot be found or loaded."""


class Interrupted(RaysentError):
    """A search or final phase stopped before all its trials ended (Ctrl-C): its state is saved."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' when a close match exists, else ''."""
    match = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f" (did you mean '{match[0]}'?)" if match else ""


def advice(cli: str, python: str) -> str:
    """The fix an error suggests, as the user who hit it would type it: ``cli`` (``--set model.name=PATH``) when
    a ``raysent`` command runs, ``python`` (``raysent.load("path/to/folder")``) otherwise."""
    return cli if DOOR.get() == "cli" else python


def set_field(field: str, value: str = "PATH") -> str:
    """How to give an experiment field another value, at the door the user came in by."""
    return advice(f"--set {field}={value}", f'overrides={{"{field}": "{value}"}}')

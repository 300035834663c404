"""The Hugging Face hub as a source: a pinned revision, the local cache first, and one error that says what to do.

Every hub source raysent reads names the revision it reads (a commit, pinned in the code where it is known:
:data:`raysent.data.datasets.DATASETS`), and every read returns the commit it was actually read at, which the data's
``source`` carries onto every run record (``hf://datasets/<repo>@<commit>/<file>``).

Where a file is looked for: the Hugging Face cache (``HF_HUB_CACHE``, else ``$HF_HOME/hub``, read when the call is
made, not when ``huggingface_hub`` was imported), then the hub. With ``HF_HUB_OFFLINE=1`` the cache alone: a file
downloaded once is used, offline, from then on (a cluster whose nodes have no internet downloads first, on a machine
that has it: ``raysent data --download``). The cache is huggingface_hub's own layout
(https://huggingface.co/docs/huggingface_hub/guides/manage-cache: ``<type>s--<org>--<name>/snapshots/<commit>/<file>``,
``refs/<branch>`` holding the commit), written and read only through huggingface_hub.

A failure is one :class:`~raysent.errors.DataError` that names the repository, the file and the revision, says what
went wrong in words (not in the machine's access: a machine that reached the hub and was refused is told so) and
what to do.

Imports no Ray and no MLflow; ``huggingface_hub`` only inside the functions that fetch.
"""

from __future__ import annotations

import os
from pathlib import Path

from raysent.errors import DataError, RaysentError

TRUE = ("1", "true", "yes", "on")


def hub_offline() -> bool:
    """Whether the hub may not be asked (``HF_HUB_OFFLINE`` or ``HF_DATASETS_OFFLINE``): the cache alone is read."""
    return any(os.environ.get(v, "").lower() in TRUE for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache this process reads now: ``HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (huggingface_hub's own order, read at each call)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def commit_of(path: str | Path) -> str:
    """The commit a cached file or snapshot folder was read at: the folder under ``snapshots/`` in its path."""
    parts = Path(path).parts
    if "snapshots" in parts[:-1]:
        return parts[parts.index("snapshots") + 1]
    return "unknown"


def hub_url(repo: str, commit: str, file: str = "", repo_type: str = "dataset") -> str:
    """How a record names what it read: ``hf://datasets/<repo>@<commit>[/<file>]`` (models: ``hf://<repo>@...``)."""
    kind = "datasets/" if repo_type == "dataset" else ""
    return f"hf://{kind}{repo}@{commit}" + (f"/{file}" if file else "")


def fetch_file(repo: str, file: str, revision: str | None, what: str) -> tuple[Path, str]:
    """One file of a dataset repo, from the cache (offline too) or the hub; its local path and the commit read.
    ``what`` names the data set in the error (``'sickr:test'``)."""
    from huggingface_hub import hf_hub_download

    try:
        path = hf_hub_download(repo, file, repo_type="dataset", revision=revision, cache_dir=str(hub_cache_dir()),
                               local_files_only=hub_offline())
    except Exception as exc:  # huggingface_hub's errors: offline, network, access, not found
        raise hub_error(exc, what, repo, file, revision) from None
    return Path(path), commit_of(path)


def fetch_snapshot(repo: str, revision: str | None, what: str, repo_type: str = "dataset",
                   allow_patterns: list[str] | None = None, error: type[RaysentError] = DataError) -> tuple[Path, str]:
    """A whole repository (its files matching ``allow_patterns``) at ``revision``, from the cache (offline too) or
    the hub; the local snapshot folder and its commit."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo, repo_type=repo_type, revision=revision, cache_dir=str(hub_cache_dir()),
                                   local_files_only=hub_offline(), allow_patterns=allow_patterns)
    except Exception as exc:
        raise hub_error(exc, what, repo, "", revision, repo_type, error) from None
    return Path(folder), commit_of(Path(folder) / "x")


def hub_error(exc: Exception, what: str, repo: str, file: str, revision: str | None,
              repo_type: str = "dataset", error: type[RaysentError] = DataError) -> RaysentError:
    """A huggingface_hub error as one line: what was asked for, what happened, what to do."""
    name = type(exc).__name__
    target = f"{repo}{'/' + file if file else ''} at revision {revision or 'main'}"
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    download = ("hf download " + repo + (f" {file}" if file else "") + (" --repo-type dataset" if repo_type == "dataset"
                else "") + (f" --revision {revision}" if revision else ""))
    if hub_offline() or name in ("LocalEntryNotFoundError", "OfflineModeIsEnabled"):
        if hub_offline():
            return error(
                f"{what}: {target} is not in the Hugging Face cache ({hub_cache_dir()}) and HF_HUB_OFFLINE is set, so "
                f"the hub was not asked. Fix: download it once on a machine with the hub (`{download}`, or `raysent "
                f"data --download`) into that cache, or unset HF_HUB_OFFLINE; or " + (
                    "set RAYSENT_DATA_DIR to a folder with the layout of shared/data" if repo_type == "dataset" else
                    "set RAYSENT_MODEL_DIR to a folder that holds the model"))
        return error(f"{what}: the Hugging Face hub could not be reached for {target} and it is not in the cache "
                         f"({hub_cache_dir()}): {first}. Fix: check the network or proxy (HF_ENDPOINT), or download it "
                         f"on a machine with the hub (`{download}`)")
    if name in ("GatedRepoError",) or getattr(getattr(exc, "response", None), "status_code", None) in (401, 403):
        return error(f"{what}: the hub refused access to {target} ({name}: {first}). Fix: log in with an account "
                         f"that may read it (`hf auth login`, or HF_TOKEN)")
    if name == "IncompleteSnapshotError":
        return error(f"{what}: the cached copy of {target} is incomplete ({first}). Fix: download it again on a "
                     f"machine with the hub (`{download}`)")
    if name in ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError", "RemoteEntryNotFoundError"):
        return error(f"{what}: the hub has no {target} ({name}: {first}). This raysent reads that revision; "
                         f"if the repository moved, set RAYSENT_DATA_DIR to a local copy (docs/experiments.md, 'Data "
                         f"and models from the hub')")
    return error(f"{what}: reading {target} from the Hugging Face hub failed ({name}: {first}). Fix: check the "
                     f"network or proxy (HF_ENDPOINT) and retry, or download it first (`{download}`)")

"""`raysent export MODEL OUTPUT`: any encoder with a pooling, written as a sentence-transformers model.

An export never removes a file it did not write: it writes a manifest of its files (:data:`MANIFEST`) into OUTPUT,
and a later ``--overwrite`` replaces or removes only the files listed there; every other file in OUTPUT is kept."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from raysent.cli.common import EPILOG
from raysent.errors import RaysentError
from raysent.models.locate import refuse_unreadable_pooling, resolve_model
from raysent.models.pooling import BASE_POOLINGS, check_pooling

# Lazy imports: torch, raysent's heavier modules (the command's work is imported when it runs, so `raysent --help`
# and every other command start without torch, Ray or MLflow; raysent.models.pooling's and raysent.models.locate's
# names need no torch).

POOLINGS_HELP = (f"{', '.join(p for p in BASE_POOLINGS if p != 'cls_mlp_train')}, layer<K>_<cls|mean|max> (K = 0 "
                 "for the embeddings .. L), or layeratt (a model the layeratt method trained); cls reads [CLS] "
                 "through the model's trained pooler, cls_before_pooler the raw [CLS]")
# the files an export wrote, relative to its folder (a hidden file: sentence-transformers and transformers read
# only the files they know by name, so it is in no loader's way)
MANIFEST = ".raysent-export.json"
WRITTEN_BY = "raysent export"
SHOWN = 5  # files an error lists by name


def register(sub) -> None:
    ex = sub.add_parser("export", help="write a model with its pooling as a sentence-transformers folder",
                        description="Load MODEL (a folder raysent saved, a sentence-transformers or save_pretrained "
                        "folder, a name under RAYSENT_MODEL_DIR, a hub id) and write it to OUTPUT as raysent saves "
                        "every model: save_pretrained files, raysent.json, the sentence-transformers layout "
                        "(SentenceTransformer(OUTPUT) encodes as `raysent eval` does) and a model card. A model "
                        "raysent trained is exported with the pooling it was trained for; --pooling picks another "
                        "(a baseline pooling of a raw encoder, say). The files are written into a folder beside "
                        f"OUTPUT and moved in at the end, so a failed export leaves OUTPUT as it was. OUTPUT is a new "
                        "or empty folder; one that holds files is refused, unless --overwrite: then only the files "
                        f"an earlier export wrote there (those its {MANIFEST} lists; in a model folder saved before "
                        "exports kept that list, the files this export writes) are replaced or removed, every other "
                        "file is kept, and one this export would write over is refused. OUTPUT is never the model's "
                        "own folder, inside it, or a folder that holds it.",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ex.add_argument("model", help="the model to export")
    ex.add_argument("output", help="the folder to write: a new or empty one (one that holds files needs --overwrite)")
    ex.add_argument("--pooling", metavar="POOLING", help=f"the inference pooling: {POOLINGS_HELP} (default: what "
                    "the model's raysent.json or sentence-transformers config says)")
    ex.add_argument("--max-length", type=int, help="tokens per sentence the exported model reads (default: what "
                    "the model was saved with, else 256; at most the model's positions)")
    ex.add_argument("--overwrite", action="store_true", help="write into an OUTPUT that holds files: replace or "
                    f"remove the files an earlier export wrote there (its {MANIFEST}; an export older than that "
                    "file: the files this export writes) and keep every other file; a file of yours this export "
                    "would write over is refused")
    ex.set_defaults(func=run)


# ----------------------------------------------------------------------------------------------- what OUTPUT holds
def entries(folder: Path) -> list[str]:
    """Everything under ``folder`` but its manifest, as relative POSIX paths: files, links (a link to a folder is
    not followed) and empty folders (``notes/``)."""
    found = []
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        for d in [d for d in dirs if (here / d).is_symlink()]:
            dirs.remove(d)
            files.append(d)
        found += [(here / f).relative_to(folder).as_posix() for f in files]
        if not dirs and not files and here != folder:
            found.append(here.relative_to(folder).as_posix() + "/")
    return sorted(p for p in found if p != MANIFEST)


def read_manifest(folder: Path) -> set[str] | None:
    """The files an earlier export wrote into ``folder`` (its :data:`MANIFEST`), or None where there is none."""
    path = folder / MANIFEST
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        files = data["files"] if isinstance(data, dict) and data.get("written_by") == WRITTEN_BY else None
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ValueError(f"expected {{\"written_by\": \"{WRITTEN_BY}\", \"files\": [relative paths]}}")
        bad = [f for f in files if not f or PurePosixPath(f).is_absolute() or ".." in PurePosixPath(f).parts]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a path inside the folder")
    except (OSError, ValueError) as exc:
        raise RaysentError(f"{path}: not the manifest `raysent export` writes ({exc}); it says which files an "
                           f"earlier export wrote there, so an export into {folder} needs it readable: remove it "
                           "(then no file there counts as an earlier export's) or give a new or empty folder") from None
    return {PurePosixPath(f).as_posix() for f in files}


def listed(paths: list[str]) -> str:
    return ", ".join(paths[:SHOWN]) + (f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else "")


def refuse_unless_overwrite(out: Path, overwrite: bool) -> None:
    """Refuse an OUTPUT that holds files, without ``--overwrite``; the message names the files that are not an
    earlier export's."""
    if overwrite or not out.is_dir():
        return
    present = entries(out)
    earlier = read_manifest(out)
    if not present and earlier is None:
        return
    if earlier is None and (out / "raysent.json").is_file():
        raise RaysentError(f"{out} holds a model raysent saved, with no {MANIFEST} to tell its files from others "
                           f"({len(present)} files: {listed(present)}); give a new or empty folder, or --overwrite "
                           "to replace the files this export writes and keep every other one")
    if earlier is None:
        raise RaysentError(f"{out} holds files that no earlier export wrote ({listed(present)}); give a new or empty "
                           "folder, or --overwrite to write the export beside them (they are kept)")
    theirs = [p for p in present if p not in earlier]
    if theirs:
        raise RaysentError(f"{out} holds an earlier export and files that it did not write ({listed(theirs)}); give "
                           "a new or empty folder, or --overwrite to replace the earlier export's files and keep "
                           "these")
    raise RaysentError(f"{out} holds an earlier export (the {len(earlier)} files its {MANIFEST} lists); give a new "
                       "or empty folder, or --overwrite to replace them (any other file there is kept)")


def same_or_inside(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def check_output(out: Path, model: str, overwrite: bool = False) -> None:
    """OUTPUT can take an export of ``model``: not a file, not the model's own folder (nor inside it, nor holding
    it), and absent or empty unless ``overwrite``. Reads files only: runs before torch loads."""
    if out.exists() and not out.is_dir():
        raise RaysentError(f"{out} is a file; give a folder to write the model to")
    where, _ = resolve_model(model)
    if Path(where).is_dir() and same_or_inside(Path(where).resolve(), out.resolve()):
        mine, theirs = Path(where).resolve(), out.resolve()
        how = (f"the model's folder and OUTPUT are the same folder ({mine})" if mine == theirs
               else f"OUTPUT ({theirs}) is inside the model's folder ({mine})" if theirs.is_relative_to(mine)
               else f"the model's folder ({mine}) is inside OUTPUT ({theirs})")
        raise RaysentError(f"export {model} to {out}: {how}; an export never writes where the model it reads lies "
                           "(it could replace the model's own files): give an OUTPUT outside the model's folder "
                           "that does not hold it")
    refuse_unless_overwrite(out, overwrite)


# ------------------------------------------------------------------------------------------------ writing OUTPUT
def _folder_beside(real: Path, suffix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f".{real.name}.", suffix=suffix, dir=real.parent))


@contextmanager
def written_beside(out: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """A new folder beside ``out`` to write an export into; when the block ends, its files (and a manifest of them)
    are moved into ``out`` (:func:`move_in`), and when the block raises it is deleted, leaving ``out`` as it was: a
    failed export leaves no half-written model that ``SentenceTransformer(out)`` would load."""
    real = Path(out).resolve()  # beside what a link named OUTPUT points at: the same file system, renames work
    real.parent.mkdir(parents=True, exist_ok=True)
    tmp = _folder_beside(real, ".partial")
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # as a folder made with mkdir would be (mkdtemp makes it private)
        yield tmp
        files = [f for f in entries(tmp) if not f.endswith("/")]
        (tmp / MANIFEST).write_text(json.dumps({
            "written_by": WRITTEN_BY, "about": "the files `raysent export` wrote into this folder; a later "
            "`raysent export --overwrite` replaces or removes these and no others", "files": files}, indent=2) + "\n")
        move_in(tmp, Path(out), real, files, overwrite)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def move_in(tmp: Path, out: Path, real: Path, files: list[str], overwrite: bool) -> None:
    """Move the export written in ``tmp`` (``files``, then its manifest) into ``real`` (``out`` resolved).

    What is atomic: an absent or empty OUTPUT takes ``tmp``'s place in one rename. Into a folder that holds files,
    every file is a rename of its own: the earlier export's files that are replaced or no longer written are moved
    aside (into a folder beside OUTPUT), then the new files moved in, the manifest last; an exception or Ctrl-C
    during the moves moves everything back, so OUTPUT is as it was. What is not: for the milliseconds of those
    moves, a reader of OUTPUT sees old and new files mixed, and a process killed outright (SIGKILL, power loss) in
    them leaves that mix, with the earlier files in the ``.replaced`` folder beside OUTPUT."""
    refuse_unless_overwrite(out, overwrite)  # again: files may have come since the check before the model loaded
    if not real.exists() or (real.is_dir() and not any(real.iterdir())):
        os.replace(tmp, real)  # rename(2) replaces an empty folder
        return
    present = set(entries(real))
    earlier = read_manifest(real)
    if earlier is None:  # a model raysent saved before exports wrote a manifest: its files are those written again
        ours = present & set(files) if (real / "raysent.json").is_file() else set()
    else:
        ours = earlier & present
    blocked = set()
    for f in files:
        if _taken(real / f):
            blocked.add(f)
        blocked |= {q.as_posix() for q in _folders_of(f) if _taken(real / q) and not _real_dir(real / q)}
    blocked -= ours
    if blocked:
        raise RaysentError(f"{out}: the export would write over files that no earlier export there wrote "
                           f"({listed(sorted(blocked))}); an export never replaces a file it did not write: move "
                           "them away, or give a new or empty folder")
    old = sorted(ours) + ([MANIFEST] if earlier is not None else [])  # aside: replaced, or no longer written
    aside = _folder_beside(real, ".replaced")
    moved: list[tuple[Path, Path]] = []  # (from, to) in order, to undo
    made: list[Path] = []  # folders made inside OUTPUT
    try:
        for p in old:
            (aside / p).parent.mkdir(parents=True, exist_ok=True)
            os.replace(real / p, aside / p)
            moved.append((real / p, aside / p))
        for p in [*files, MANIFEST]:
            for q in reversed(_folders_of(p)):
                if not (real / q).is_dir():
                    (real / q).mkdir()
                    made.append(real / q)
            os.replace(tmp / p, real / p)
            moved.append((tmp / p, real / p))
    except BaseException:
        for src, dst in reversed(moved):
            os.replace(dst, src)
        for folder in reversed(made):
            folder.rmdir()
        shutil.rmtree(aside, ignore_errors=True)  # empty now (were the undo to fail, the files stay there)
        raise
    shutil.rmtree(aside, ignore_errors=True)  # the earlier export's files
    # the folders of the earlier export's files that this one does not write, where nothing else is left in them
    emptied = {q for p in ours - set(files) for q in _folders_of(p)}
    for rel in sorted(emptied, key=lambda q: -len(q.parts)):
        if _real_dir(real / rel) and not any((real / rel).iterdir()):
            (real / rel).rmdir()


def _folders_of(path: str) -> list[PurePosixPath]:
    """The folders a relative path lies in, innermost first (``a/b/c``: ``a/b``, ``a``)."""
    return list(PurePosixPath(path).parents)[:-1]


def _taken(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _real_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def run(args) -> int:
    # what can be checked without the model, before torch loads (seconds)
    check_pooling(args.pooling, "--pooling", error=RaysentError)
    if args.max_length is not None and args.max_length < 2:
        raise RaysentError(f"--max-length {args.max_length}: expected at least 2 tokens")
    out = Path(args.output)
    check_output(out, args.model, args.overwrite)
    refuse_unreadable_pooling(args.model, args.pooling)  # from the model's files: cls without a trained pooler

    from raysent.methods.card import write_card
    from raysent.models.sentence_encoder import load

    # refuses a pooling the model cannot read (cls without a trained pooler, layeratt without its pooler) and a
    # --max-length beyond its positions, before anything is written
    model = load(args.model, pooling=args.pooling, max_length=args.max_length)
    extra = {k: v for k, v in (model.encoder.meta.extra or {}).items()
             if k not in ("pooling", "saved_by", "has_trained_pooler", "sentence_transformers")}
    with written_beside(out, args.overwrite) as folder:
        model.encoder.save(folder, model.pooling, mlp=model.encoder.head, extra=extra, max_length=model.max_length)
        write_card(folder)
    print(f"wrote {out} (pooling {model.pooling}, {model.max_length} tokens): "
          f"SentenceTransformer({str(out)!r}"
          + (", trust_remote_code=True" if model.pooling in ("mean_no_cls", "layeratt") else "") + ") loads it",
          file=sys.stderr)
    return 0

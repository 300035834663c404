"""Paper-style result tables: one row per configuration (or per value of a field), STS12 ... Avg.

``raysent table [EXPERIMENT ...]`` (see docs/search.md, "Results tables, plots and comparisons").

Cells are ``mean±std (n)`` over the runs of a row: the mean, the *sample* standard deviation
(``ddof=1``, the ± the papers print) and ``n`` the runs that have the score. When fewer runs than
expected have it (a seed whose run file is missing, a run without that data set) the cell says
``(n/N)`` and a note under the table names the seed and the file; a cell no run has is ``— (0/N)``.
``N`` comes from the configuration's seeds (``config.seeds``; in the search phase the first
``search.seeds`` of them). Avg is the mean of the seven sets of one run, so a run without one
of them has no Avg. A single run has no std: ``70.21 (1)``.

``--published`` adds the papers' rows (``results/published.yaml``), marked ``[paper]``, and under a
paper row whose method and encoder are ours a ``Δ`` row: our mean minus the paper's number.

Outputs: markdown (printed), LaTeX (booktabs; ``_ % & # $ { } ~ ^ \\ [ ]`` escaped) and CSV
(numbers: ``<set>_mean``, ``<set>_std``, ``<set>_n``, ``<set>_expected``). Imports no Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raysent.errors import RaysentError
from raysent.report import published as pub
from raysent.report.runs import (
    CORRELATIONS,
    TASK_LABELS,
    TASKS,
    Run,
    check_aggregation,
    check_choice,
    check_fields,
    format_value,
    short_model,
)

COLUMNS = (*TASKS, "avg")
MISSING = "—"
# fields that differ between the seeds of one configuration by design (not reported as "varies")
_SEED_FIELDS = {"seed", "train.seed", "config_id", "search", "experiment", "name", "phase", "trial_id"}


@dataclass
class Cell:
    """The numbers of one row × data set."""

    values: list[float] = field(default_factory=list)
    expected: int | None = None  # runs that should have had it (None: unknown)
    std_given: float | None = None  # a published ± (paper rows)
    runs_given: int | None = None  # a published run count (paper rows)
    delta: bool = False  # a difference row: the value is ours − paper
    paper: bool = False  # a published number (its ± and run count as printed)

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.values)) if self.values else None

    @property
    def std(self) -> float | None:
        if self.std_given is not None:
            return self.std_given
        return float(np.std(self.values, ddof=1)) if len(self.values) > 1 else None

    def text(self) -> str:
        """``mean±std (n)``; ``(n/N)`` when N runs were expected; ``—`` when no run has the score."""
        if self.delta:
            return MISSING if self.mean is None else f"{self.mean:+.2f}"
        if self.paper:
            if self.mean is None:
                return MISSING
            return (f"{self.mean:.2f}" + (f"±{self.std_given:.2f}" if self.std_given is not None else "")
                    + (f" ({self.runs_given})" if self.runs_given else ""))
        count = f" ({self.n}/{self.expected})" if self.expected is not None and self.n != self.expected \
            else f" ({self.n})"
        if self.mean is None:
            return MISSING + count
        return f"{self.mean:.2f}" + (f"±{self.std:.2f}" if self.std is not None else "") + count


@dataclass
class Row:
    kind: str  # ours | paper | delta
    label: str
    model: str
    key: str  # short name used by the notes
    cells: dict[str, Cell]
    notes: list[str] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # experiment, method, config_id, group values (CSV)


@dataclass
class Table:
    rows: list[Row]
    columns: tuple[str, ...]
    caption: str
    notes: list[str]
    aggregation: str
    correlation: str

    # ------------------------------------------------------------------ frames
    def frame(self) -> pd.DataFrame:
        """The table as printed: string cells."""
        data = [{"Row": r.label, "Model": r.model, **{TASK_LABELS[c]: r.cells[c].text() for c in self.columns}}
                for r in self.rows]
        return pd.DataFrame(data, columns=["Row", "Model", *[TASK_LABELS[c] for c in self.columns]])

    def numbers(self) -> pd.DataFrame:
        """The table as numbers (the CSV): mean, std, n and expected n per data set."""
        out = []
        for r in self.rows:
            rec: dict[str, Any] = {"kind": r.kind, "row": r.label, "key": r.key, "model": r.model, **r.info}
            for c in self.columns:
                cell = r.cells[c]
                rec[f"{c}_mean"] = cell.mean
                rec[f"{c}_std"] = cell.std
                rec[f"{c}_n"] = (cell.runs_given if cell.runs_given is not None
                                 else (cell.n if r.kind == "ours" else None))
                rec[f"{c}_expected"] = cell.expected
            out.append(rec)
        df = pd.DataFrame(out)
        for c in df.columns:
            if c.endswith("_n") or c.endswith("_expected"):
                df[c] = df[c].astype("Int64")
        return df

    # ------------------------------------------------------------------ text
    def to_markdown(self) -> str:
        df = self.frame()
        head = [escape_markdown(h) for h in df.columns]
        align = [":---" if i < 2 else "---:" for i in range(len(head))]
        lines = [f"Table: {escape_markdown(self.caption)}", "", "| " + " | ".join(head) + " |",
                 "| " + " | ".join(align) + " |"]
        for _, rec in df.iterrows():
            lines.append("| " + " | ".join(escape_markdown(str(v)) for v in rec.values) + " |")
        if self.notes:
            lines += ["", "Notes:", ""] + [f"- {escape_markdown(n)}" for n in self.notes]
        return "\n".join(lines) + "\n"

    def to_latex(self) -> str:
        df = self.frame()
        spec = "ll" + "r" * (len(df.columns) - 2)
        lines = ["% generated by `raysent table`; needs \\usepackage{booktabs}",
                 "\\begin{table}[t]", "\\centering", "\\small", f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
                 " & ".join(escape_latex(h) for h in df.columns) + " \\\\", "\\midrule"]
        kinds = [r.kind for r in self.rows]
        for i, (_, rec) in enumerate(df.iterrows()):
            if i and kinds[i] == "paper" and kinds[i - 1] == "ours":
                lines.append("\\midrule")
            lines.append(" & ".join(escape_latex(str(v)) for v in rec.values) + " \\\\")
        lines += ["\\bottomrule", "\\end{tabular}"]
        if self.notes:
            lines.append("\\par\\smallskip{\\footnotesize\\raggedright Notes: "
                         + "; ".join(escape_latex(n) for n in self.notes) + ".\\par}")
        lines += [f"\\caption{{{escape_latex(self.caption)}}}", "\\end{table}"]
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        return self.numbers().to_csv(index=False)

    def write(self, stem: str | Path) -> list[Path]:
        stem = Path(stem)
        stem.parent.mkdir(parents=True, exist_ok=True)
        paths = []
        for ext, text in (("md", self.to_markdown()), ("tex", self.to_latex()), ("csv", self.to_csv())):
            p = stem.with_name(f"{stem.name}.{ext}")
            tmp = p.with_name(p.name + ".tmp")
            tmp.write_text(text, encoding="utf-8")
            tmp.replace(p)
            paths.append(p)
        return paths


# --------------------------------------------------------------------------- escaping
_MD_SPECIAL = "\\`*_|<>"


def escape_markdown(text: str) -> str:
    """Backslash-escape what markdown (a GFM table cell) would read as markup: \\ ` * _ | < >."""
    return "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(text))


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{",
          "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
          # a cell that starts with [ right after \\ would be read as \\[<length>]
          "[": "{[}", "]": "{]}",
          "±": r"$\pm$", "—": "--", "−": "$-$", "Δ": r"$\Delta$", "×": r"$\times$", "†": r"\dag{}",
          "‡": r"\ddag{}", "…": r"\dots{}"}


def escape_latex(text: str) -> str:
    """LaTeX-safe text: the ten special characters, brackets, and ± — − Δ × † ‡ as commands."""
    return "".join(_LATEX.get(ch, ch) for ch in str(text))


# --------------------------------------------------------------------------- building
def _sort_key(v: Any):
    if isinstance(v, bool) or v is None:
        return (1, str(v))
    if isinstance(v, (int, float)):
        return (0, float(v))
    return (1, str(v))


def _varying(runs: list[Run], skip: set[str]) -> dict[str, list]:
    """Fields whose values differ between ``runs`` (seed and identity fields excepted)."""
    keys: set[str] = set()
    for r in runs:
        keys.update(r.fields())
    out = {}
    for k in sorted(keys):
        last = k.split(".")[-1]
        if k in _SEED_FIELDS or last in _SEED_FIELDS or k in skip or last in skip:
            continue
        vals = list(dict.fromkeys(r.fields().get(k, "(unset)") for r in runs))
        if len(vals) > 1:
            out[k] = vals
    plain = {k for k in out if "." not in k}
    return {k: v for k, v in out.items() if "." not in k or k.split(".")[-1] not in plain}


def _our_row(runs: list[Run], key_vals: dict[str, Any] | None, columns, aggregation, correlation,
             label: str, key: str) -> Row:
    units: dict[tuple, list[Run]] = {}
    for r in runs:
        units.setdefault(r.unit, []).append(r)
    expected_total: int | None = 0
    notes: list[str] = []
    for unit, rs in units.items():
        exp = rs[0].expected_seeds()
        for f in ("seed", "train.seed", "hyperparameters.seed"):
            if exp is not None and key_vals and f in key_vals:  # one row per seed: only that seed is expected
                exp = [s for s in exp if s == key_vals[f]]
        if exp is None:
            expected_total = None
            notes.append(f"{unit[3]}: the expected seeds cannot be read from the run files; n is the runs found")
            continue
        if expected_total is not None:
            expected_total += len(exp)
        have = {r.seed for r in rs}
        missing = [s for s in exp if s not in have]
        where = f"{rs[0].path.parent}/{unit[1]}-{unit[2]}-{unit[3]}-seed<S>.json"
        for s in missing:
            notes.append(f"{unit[3]} seed {s}: no run file ({where.replace('<S>', str(s))}; expected seeds "
                         f"{', '.join(map(str, exp))})")
        extra = sorted(s for s in have if s not in exp)
        if extra:
            notes.append(f"{unit[3]}: seed(s) {', '.join(map(str, extra))} are not among the configuration's seeds "
                         f"({', '.join(map(str, exp))}) but are counted")
    cells = {}
    for c in columns:
        vals = [v for v in (r.score(c, aggregation, correlation) for r in runs) if v is not None]
        cells[c] = Cell(values=vals, expected=expected_total)
    test_cols = [c for c in columns if c in TASKS]
    for r in sorted(runs, key=lambda r: (r.config_id, r.seed or 0)):
        if not any(k.startswith("sts/") for k in r.record.scores):
            if r.phase != "search" and test_cols:
                notes.append(f"{r.config_id} seed {r.seed}: no test scores in {r.path.name}")
            continue
        lacking = [TASK_LABELS[t] for t in test_cols if r.score(t, aggregation, correlation) is None]
        if lacking:
            notes.append(f"{r.config_id} seed {r.seed}: no {', '.join(lacking)} score in {r.path.name}"
                         + (" (so no Avg)" if "avg" in columns else ""))
    r0 = runs[0]
    info: dict[str, Any] = {"experiment": ",".join(sorted({r.experiment for r in runs})), "phase": r0.phase,
                            "method": ",".join(sorted({r.method for r in runs})),
                            "config_id": ",".join(sorted({r.config_id for r in runs}))}
    if key_vals:
        info.update({k: format_value(v) for k, v in key_vals.items()})
    else:
        info.update({k: format_value(v) for k, v in r0.hp.items()})
    return Row("ours", label, short_model(r0.model), key, cells, notes, runs, info)


def build_table(
    runs: list[Run],
    aggregation: str = "all",
    correlation: str = "spearman",
    group_by: list[str] | None = None,
    published: str | None = None,
    published_file: str | Path | None = None,
    dev: bool | None = None,
    title: str | None = None,
) -> Table:
    """The table of ``runs`` (see the module docstring). ``published``: None, ``match``, ``all`` or paper names."""
    if not runs:
        raise RaysentError("no runs to tabulate")
    check_choice(correlation, CORRELATIONS, "--correlation")
    check_aggregation(runs, aggregation)
    group_by = [g for g in (group_by or []) if g]
    if group_by:
        check_fields(runs, group_by)
    phases = sorted({r.phase for r in runs})
    if dev is None:
        dev = "search" in phases
    columns = COLUMNS + (("dev",) if dev else ())
    exps = sorted({r.experiment for r in runs})
    searches = {(r.experiment, r.search) for r in runs}

    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        key = ((r.method, r.model, *(r.fields().get(g, "(unset)") for g in group_by)) if group_by else r.unit)
        groups.setdefault(key, []).append(r)

    rows: list[Row] = []
    for key, rs in groups.items():
        r0 = rs[0]
        trans = " [transductive]" if any(r.transductive for r in rs) else ""
        flat = [r for r in rs if r.learned is False]
        if flat:  # the best checkpoint is the untouched encoder: the row reports the input model, not training
            trans += f" [no learning: {len(flat)}/{len(rs)} at step 0]"
        if group_by:
            vals = dict(zip(group_by, key[2:]))
            gtxt = ", ".join(f"{g}={format_value(v)}" for g, v in vals.items())
            gexps = sorted({r.experiment for r in rs})
            label = (f"{','.join(gexps)}: " if len(exps) > 1 else "") + f"{r0.method}, {gtxt}{trans}"
            row = _our_row(rs, vals, columns, aggregation, correlation, label, gtxt)
            varying = _varying(rs, set(group_by))
            if varying:
                row.notes.append("the runs of this row differ in " + "; ".join(
                    f"{k} ({', '.join(format_value(v) for v in vs)})" for k, vs in varying.items()))
            row.info["_sort"] = tuple(_sort_key(v) for v in key[2:])
        else:
            hp = ", ".join(f"{k}={format_value(v)}" for k, v in r0.hp.items())
            ident = r0.config_id + (f", search {r0.search}" if len(searches) > len(exps) else "")
            label = f"{r0.experiment}: {r0.method}" + (f" ({hp})" if hp else "") + f" [{ident}]{trans}"
            row = _our_row(rs, None, columns, aggregation, correlation, label, f"{r0.experiment}/{r0.config_id}")
            row.info["_sort"] = (r0.experiment, r0.search, label)
        rows.append(row)
    rows.sort(key=lambda r: (r.info.get("experiment", ""), r.info["_sort"]) if not group_by else r.info["_sort"])
    for row in rows:
        row.info.pop("_sort", None)

    notes = [f"{r.key}: {n}" for r in rows for n in r.notes]
    if any("[no learning:" in r.label for r in rows):
        notes.append("[no learning: k/n at step 0]: in k of the row's n runs the best dev score was the untouched "
                     "encoder's (step 0), so those runs report the input model, not what training made of it")
    notes += hub_notes(runs)
    if "search" in phases:
        notes.insert(0, "search-phase runs are not evaluated on the test sets (the final phase is), so their test "
                     "cells are empty; their model-selection score is the Dev column")
    if published:
        rows, pnotes = _add_published(rows, published, published_file, columns, aggregation, correlation)
        notes += pnotes

    phase_txt = " and ".join(phases)
    corr = {"spearman": "Spearman", "pearson": "Pearson"}[correlation]
    caption = (f"{title or ', '.join(exps)}: {phase_txt} phase; {corr} ×100 of cosine similarity; STS12-16 "
               f"aggregated as '{aggregation}'; cells: mean±std (n) over n runs, sample std (n−1); (n/N): only n of "
               f"the N expected runs have the score; {MISSING}: no score"
               + ("; Dev: the best model-selection score (data.dev, STS-B dev by default), not a test score"
                  if dev else "")
               + (f"; rows grouped by {', '.join(group_by)}" if group_by else ""))
    return Table(rows, columns, caption, notes, aggregation, correlation)


def hub_notes(runs: list[Run]) -> list[str]:
    """A note per hub repository and commit the runs' test sets and models were read from (``hf://...@<commit>``):
    which copy of the data and which revision of the model the numbers are of. Local copies need no note (the
    data's layout is shared/data's); a table whose runs read different copies of one set says so."""
    by_source: dict[str, set[str]] = {}
    copies: dict[str, set[str]] = {}
    for r in runs:
        sts = r.record.eval.sts if r.record.eval is not None else None
        read = {**(r.record.sources or {}), **({f"test {k}": v for k, v in sts.sources.items()} if sts else {})}
        for what, src in read.items():
            copies.setdefault(what, set()).add(src.split("@")[0] if src.startswith("hf://") else "local")
            if src.startswith("hf://"):
                repo_at = "/".join(src.split("/")[:5]) if src.startswith("hf://datasets/") else "/".join(
                    src.split("/")[:4])
                by_source.setdefault(repo_at, set()).add(what.split(" ", 1)[-1].split(":")[0])
    notes = [f"read from the Hugging Face hub: {src} ({', '.join(sorted(what))})" for src, what in sorted(
        by_source.items())]
    mixed = sorted(w for w, kinds in copies.items() if len(kinds) > 1)
    if mixed:
        notes.append(f"the runs read different copies of {', '.join(mixed)} (local and hub, or two hub sources): "
                     "compare them with care")
    return notes


def _add_published(rows: list[Row], which: str, path, columns, aggregation, correlation) -> tuple[list[Row], list[str]]:
    entries = pub.load(path)
    ours = [r for r in rows if r.kind == "ours"]
    methods = {m for r in ours for m in r.info["method"].split(",")}
    chosen = pub.select(entries, which, methods)
    notes: list[str] = []
    if not chosen:
        notes.append(f"--published {which}: no entry of results/published.yaml has the method(s) "
                     f"{', '.join(sorted(methods))}; --published all shows every paper row")
        return rows, notes
    if correlation != "spearman":
        notes.append("[paper] rows are Spearman (every paper reports Spearman); no differences are computed "
                     f"against our {correlation} numbers")
    out = list(rows)
    matched_any = False
    for e in chosen:
        cells = {}
        for c in columns:
            val = pub.score(e, c) if c != "dev" else None
            cell = Cell(values=[] if val is None else [val], std_given=pub.std(e, c), runs_given=e.get("runs"),
                        paper=True)
            if val is None:
                cell.runs_given = None
            cells[c] = cell
        ev = e["eval"]
        trans = " [transductive]" if ev.get("transductive") else ""
        prow = Row("paper", pub.label(e) + trans, short_model(str(e["model"])), f"[paper] {e['paper']['short']} "
                   f"{e['table']} {e['row']}", cells, info={"experiment": "", "method": e.get("method") or "",
                                                             "paper": e["paper"]["short"], "table": e["table"]})
        out.append(prow)
        if e.get("avg_over") and "avg" in e["scores"]:
            over = ", ".join(TASK_LABELS.get(t, t) for t in e["avg_over"])
            notes.append(f"{prow.key}: the paper's Avg is over {over} only (ours: all seven)")
        if e.get("avg_as_printed"):
            notes.append(f"{prow.key}: the Avg is as printed; it is not the mean of the printed scores")
        for r in ours:
            if correlation != "spearman":
                continue
            hyper = r.runs[0].record.hyperparameters
            if not any(pub.matches(e, m, r.runs[0].model, hyper) for m in r.info["method"].split(",")):
                continue
            matched_any = True
            dcells = {}
            for c in columns:
                ours_v, paper_v = r.cells[c].mean, pub.score(e, c) if c != "dev" else None
                if c == "avg" and e.get("avg_over"):
                    paper_v = None  # the paper's Avg covers other sets
                dcells[c] = Cell(values=[] if ours_v is None or paper_v is None else [ours_v - paper_v], delta=True)
            drow = Row("delta", f"Δ {r.key} − [paper] above", "", f"Δ {r.key}", dcells,
                       info={"experiment": r.info["experiment"], "method": r.info["method"],
                             "paper": e["paper"]["short"], "table": e["table"]})
            out.append(drow)
            pagg = ev.get("aggregation")
            if pagg != aggregation:
                notes.append(f"{drow.key} vs {prow.key}: the paper's STS12-16 aggregation is '{pagg}', ours "
                             f"'{aggregation}': the STS12-16 differences compare two protocols")
            if bool(ev.get("transductive")) != any(x.transductive for x in r.runs):
                notes.append(f"{drow.key} vs {prow.key}: one of the two is transductive, the other is not")
    if not matched_any and correlation == "spearman":
        ourpairs = sorted({(r.info["method"], r.model) for r in ours})
        notes.append("no [paper] row has our method and encoder ("
                     + "; ".join(f"{m} / {mo}" for m, mo in ourpairs)
                     + "), so no Δ rows: differences are computed only for the same method and encoder")
    return out, notes


def output_stem(results_dir: str | Path, experiments: list[str], phase: str, aggregation: str, correlation: str,
                group_by: list[str] | None, published: str | None, search: str | None = None) -> Path:
    """results/<experiment>/table (defaults) or table-<what differs> (so variants do not overwrite it)."""
    parts = []
    if phase != "final":
        parts.append(phase)
    if aggregation != "all":
        parts.append(aggregation)
    if correlation != "spearman":
        parts.append(correlation)
    if group_by:
        parts.append("by-" + "-".join(group_by))
    if published:
        parts.append("published" if published == "match" else "published-" + published.replace(",", "-"))
    if search:
        parts.append(f"search-{search}")
    name = "table" + ("-" + "-".join(parts) if parts else "")
    root = Path(results_dir)
    if len(experiments) == 1:
        return root / experiments[0] / name
    return root / f"{name}-{'+'.join(experiments)}"

"""The docs run as written, and the front door shows what the suite wrote.

Every shell (```bash) and Python (```python) block of README.md and docs/*.md runs here, in a folder of its own
outside the repository: a copy of search_spaces/, benchmarks/, clusters/ and the committed results/, with
``../shared/data`` and ``../shared/models`` beside it pointing at $RAYSENT_DATA_DIR and $RAYSENT_MODEL_DIR (so a
block that names ``RAYSENT_DATA_DIR=../shared/data`` reads the data the tests read). Nothing a block writes
(results/, mlflow.db) lands in the repository, and the test checks that it did not.

A block's tier is set by an HTML comment on the line before its fence (docs/testing.md, "Doc blocks"):

    (no marker)                         run in a fresh folder of its own: it must train nothing and import no Ray
    <!-- doctest: slow (why) -->        it trains, or loads and embeds with a model: run after the setup block
    <!-- doctest: setup (why) -->       run first, once: the slow blocks run after it, in its folder
    <!-- doctest: skip (why) -->        never run here; the reason is required (`ray up`, the 2-hour suite, ...)
    <!-- doctest: elsewhere (TEST: why) -->  run by that test file, which checks what it prints

Every block runs in the slow tier: even a block that trains nothing starts a `raysent` process or two (a few
seconds each, ~14 blocks), which the fast tier's 90 s cannot hold; the fast tier checks the markers, the quoted
output's pattern, the links and the names the pages give. So a new block is run (and fails the suite if it cannot
run) unless its page says why not. A fence without a
language right after a block (a blank line between) is what the block prints: its lines must appear in the
output in order; a line ``...`` stands for any lines, and ``...`` inside a line for any text.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, cli_in_process

README = REPO / "README.md"
RESULTS_DOC = REPO / "docs" / "results.md"
MINI = REPO / "results" / "mini"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
SHELL, PYTHON = ("bash", "sh", "shell", "console"), ("python", "py")
KINDS = ("slow", "setup", "skip", "elsewhere")
MARKER = re.compile(r"<!-- doctest: (?P<kind>[\w-]+)(?: \((?P<why>.+)\))? -->")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[ \t]*\n(?P<body>.*?)^```[ \t]*$", re.S | re.M)
COPIED = ("search_spaces", "benchmarks", "clusters")  # what the blocks read beside results/


def block(text: str, marker: str) -> str:
    """What stands between ``<!-- marker -->`` and ``<!-- /marker -->`` (exactly one such block)."""
    assert text.count(f"<!-- {marker} -->") == 1 and text.count(f"<!-- /{marker} -->") == 1, marker
    return text.split(f"<!-- {marker} -->\n", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


# --------------------------------------------------------------------------- the blocks
@dataclass
class DocBlock:
    page: Path
    line: int  # of the opening fence
    lang: str
    code: str
    kind: str  # run (the fast tier), slow, setup, skip, elsewhere
    why: str
    output: str | None  # the fence after it: what the page says it prints

    @property
    def id(self) -> str:
        return f"{self.page.name}:{self.line}"


def doc_blocks(page: Path) -> list[DocBlock]:
    """The shell and Python blocks of a page, each with its marker and the output the page quotes."""
    text = page.read_text(encoding="utf-8")
    fences = list(FENCE.finditer(text))
    out = []
    for i, m in enumerate(fences):
        lang = m.group("lang").lower()
        if lang not in SHELL + PYTHON:
            continue
        before = text[: m.start()][:-1].rsplit("\n", 1)[-1]  # the line before the fence
        marker = MARKER.fullmatch(before.strip())
        nxt = fences[i + 1] if i + 1 < len(fences) else None
        quoted = (nxt.group("body") if nxt is not None and nxt.group("lang") in ("", "text")
                  and not text[m.end(): nxt.start()].strip() else None)
        out.append(DocBlock(page=page, line=text[: m.start()].count("\n") + 1, lang=lang, code=m.group("body"),
                            kind=marker.group("kind") if marker else "run",
                            why=(marker.group("why") or "") if marker else "", output=quoted))
    return out


BLOCKS = [b for page in PAGES for b in doc_blocks(page)]


def test_every_marker_is_known_and_says_why_and_stands_before_a_block():
    problems = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        starts = {b.line for b in doc_blocks(page)}
        for m in re.finditer(r"<!-- doctest:.*?-->", text):
            line = text[: m.start()].count("\n") + 1
            marker = MARKER.fullmatch(m.group(0))
            if marker is None or marker.group("kind") not in KINDS:
                problems.append(f"{page.name}:{line}: {m.group(0)}: expected <!-- doctest: KIND (why) -->, KIND one "
                                f"of {', '.join(KINDS)}")
            elif marker.group("kind") in ("skip", "elsewhere") and not marker.group("why"):
                problems.append(f"{page.name}:{line}: a {marker.group('kind')} marker says why, in parentheses")
            elif line + 1 not in starts:
                problems.append(f"{page.name}:{line}: the marker is not on the line before a bash or python block")
    assert not problems, "\n".join(problems)
    assert sum(b.kind == "setup" for b in BLOCKS) <= 1


@pytest.mark.parametrize("b", [b for b in BLOCKS if b.kind == "elsewhere"], ids=lambda b: b.id)
def test_a_block_run_elsewhere_names_a_test_that_reads_its_page(b):
    test = REPO / b.why.split(":")[0].strip()
    assert test.is_file() and test.name.startswith("test_"), f"{b.id}: {b.why}: no such test file"
    assert f"docs/{b.page.name}" in test.read_text(encoding="utf-8"), f"{b.id}: {test.name} does not read the page"


# --------------------------------------------------------------------------- running one
def folder_for_blocks(root: Path, with_quick: bool = True) -> Path:
    """A work folder like a checkout after its user ran the README's main job again: the files the blocks read, the
    results HEAD commits, a second, newer search of ``quick`` with other numbers (:func:`add_a_user_search`), and
    ../shared beside it. (Without ``with_quick``: no results/quick at all, for the slow blocks' own search.)"""
    work = root / "work"
    work.mkdir(parents=True)
    for name in COPIED:
        shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    copy_committed_results(work)
    if with_quick:
        add_a_user_search(work / "results" / "quick")
    else:
        shutil.rmtree(work / "results" / "quick")
    shared = root / "shared"
    shared.mkdir()
    (shared / "data").symlink_to(Path(os.environ["RAYSENT_DATA_DIR"]).resolve())
    (shared / "models").symlink_to(Path(os.environ["RAYSENT_MODEL_DIR"]).resolve())
    return work


def copy_committed_results(work: Path) -> None:
    """results/ as HEAD commits it, into ``work``: never what a user's runs added to or changed in the working tree
    (the README's main job writes results/quick/, which git tracks). Outside a git checkout: the working tree's
    results/ without what a run leaves there."""
    try:
        archive = subprocess.run(["git", "archive", "--format=tar", "HEAD", "results"], capture_output=True,
                                 cwd=REPO, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        skip = ("mlflow.db", "mlartifacts", "mlruns", "tune", "final", "search")
        for p in (REPO / "results").rglob("*"):
            rel = p.relative_to(REPO)
            if p.is_file() and not any(s in p.relative_to(REPO / "results").parts for s in skip):
                (work / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(p, work / rel)
        return
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(work, filter="data")


USER_SEARCH = "20261201-093000"  # newer than the committed search of quick, 20261127-150022


def add_a_user_search(quick: Path) -> None:
    """What a user's second run of the main job leaves in results/quick: a newer search's run files, same
    configurations, other numbers (every score 0.5 higher), its summary.json and best.yaml in place of the committed
    ones. The docs' examples must show the committed search still (they name it) and not fail on two searches."""

    def shifted(value):
        if isinstance(value, float):
            return value + 0.5
        if isinstance(value, dict):
            return {k: shifted(v) for k, v in value.items()}
        if isinstance(value, list):
            return [shifted(v) for v in value]
        return value

    for f in sorted((quick / "runs").glob("*-20261127-150022-*.json")):
        record = json.loads(f.read_text())
        record["search"] = USER_SEARCH
        for key in ("scores", "eval", "best_dev_spearman", "dev_curve"):
            if key in record:
                record[key] = shifted(record[key])
        (f.parent / f.name.replace("20261127-150022", USER_SEARCH)).write_text(json.dumps(record, indent=2))
    summary = json.loads((quick / "summary.json").read_text())
    (quick / "summary.json").write_text(json.dumps(summary, indent=2).replace("20261127-150022", USER_SEARCH))


@pytest.mark.shared
def test_the_blocks_folder_holds_heads_results_and_a_users_second_search(tmp_path):
    """The folder the doc blocks run in: a table of ``quick`` is the user's newer search, saying that another exists;
    ``--search`` gives the committed one, whose numbers docs/search.md quotes."""
    work = folder_for_blocks(tmp_path)
    results = str(work / "results")
    newest = cli_in_process("table", "quick", "--results-dir", results, "--no-write").stdout
    assert f"quick: the newest of its 2 searches, {USER_SEARCH} (the others: 20261127-150022" in newest
    assert "41.57±0.81 (2)" in newest and "41.07±0.81 (2)" not in newest  # the user's numbers (+0.5)
    committed = cli_in_process("table", "quick", "--results-dir", results, "--no-write", "--search",
                               "20261127-150022").stdout
    assert "41.07±0.81 (2)" in committed and "newest" not in committed
    git = subprocess.run(["git", "ls-tree", "-r", "--name-only", "HEAD", "results"], capture_output=True, text=True,
                         cwd=REPO)
    if git.returncode == 0:  # in a checkout: exactly HEAD's files, whatever the working tree holds
        here = {str(p.relative_to(work)) for p in (work / "results").rglob("*") if p.is_file()}
        assert here - {p for p in here if USER_SEARCH in p} == set(git.stdout.split())


def repo_state() -> set[str]:
    """What a block must not add to the repository: its top-level entries and those of results/."""
    return {p.name for p in REPO.iterdir()} | {f"results/{p.name}" for p in (REPO / "results").iterdir()}


# what each block printed, by (where it ran, language, code): a block whose code another page shows word for word
# (the README's MLflow lines are search.md's) runs once, and each page's quoted output is checked against that run
_PRINTED: dict[tuple[str, str, str], str] = {}


def run_block_once(b: DocBlock, work: Path, timeout: float, where: str) -> str:
    """:func:`run_block`, or, for a block whose code an earlier block of the same kind ran in the same kind of
    folder (``where``), that block's output, checked against what this page quotes."""
    key = (where, b.lang, b.code.strip())
    if key not in _PRINTED:
        _PRINTED[key] = run_block(b, work, timeout)
    elif b.output is not None:
        check_output(b, _PRINTED[key])
    return _PRINTED[key]


def run_block(b: DocBlock, work: Path, timeout: float) -> str:
    """Run the block in ``work`` (bash -e, or a fresh Python) with the tests' environment; its output, both
    streams in order. The block must exit 0 and leave the repository as it was."""
    path = [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    env = {**os.environ, "PATH": os.pathsep.join(path)}
    before = repo_state()
    argv = (["bash", "-e", "-o", "pipefail", "-c", b.code] if b.lang in SHELL else [sys.executable, "-c", b.code])
    proc = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{b.id} failed ({proc.returncode}), run as written in {work}:\n{b.code}\n" \
                                 f"{proc.stdout[-5000:]}"
    assert repo_state() == before, f"{b.id} wrote into the repository: {sorted(repo_state() - before)}"
    if b.output is not None:
        check_output(b, proc.stdout)
    return proc.stdout


def quoted_pattern(quoted: str) -> re.Pattern:
    """The quoted output as a pattern: its lines in order, ``...`` alone any lines, ``...`` in a line any text."""
    parts = []
    for line in quoted.rstrip("\n").split("\n"):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(re.escape(p) for p in line.rstrip().split("...")) + r"[ \t]*\n")
    return re.compile("".join(parts), re.M)


def check_output(b: DocBlock, printed: str) -> None:
    text = "\n".join(line.rstrip() for line in printed.splitlines()) + "\n"
    assert quoted_pattern(b.output or "").search(text), (
        f"{b.id}: the output the page quotes is not what the block prints.\nquoted:\n{b.output}\nprinted:\n"
        f"{printed[-6000:]}")


def test_the_quoted_output_pattern():
    b = DocBlock(REPO, 1, "bash", "", "run", "", "A = x: ... seeds 1, 2\n...\nnote: done\n")
    check_output(b, "start\nA = x: quick search (lr=1) , seeds 1, 2\nrow 1\nrow 2\nnote: done  \nbudget\n")
    for printed in ("A = x: seeds 1, 3\nnote: done\n", "note: done\nA = x: a seeds 1, 2\n"):
        with pytest.raises(AssertionError):
            check_output(b, printed)


def test_a_block_two_pages_show_runs_once_and_each_page_s_quote_is_checked(tmp_path):
    first = DocBlock(REPO / "README.md", 1, "bash", "echo ran >> count; wc -l < count\n", "run", "", "1\n")
    again = DocBlock(REPO / "docs" / "search.md", 9, "bash", first.code, "run", "", "1\n")
    assert run_block_once(first, tmp_path, 10, "test") == run_block_once(again, tmp_path, 10, "test") == "1\n"
    assert (tmp_path / "count").read_text() == "ran\n"  # it ran once
    wrong = DocBlock(again.page, 20, "bash", first.code, "run", "", "2\n")  # a page quoting what it did not print
    with pytest.raises(AssertionError):
        run_block_once(wrong, tmp_path, 10, "test")
    assert run_block_once(DocBlock(again.page, 30, "bash", first.code, "run", "", None), tmp_path, 10, "other") \
        == "2\n"  # another kind of folder: run there


@pytest.mark.slow  # a `raysent` process or two per block (module docstring)
@pytest.mark.shared
@pytest.mark.parametrize("b", [b for b in BLOCKS if b.kind == "run"], ids=lambda b: b.id)
def test_a_block_runs_as_written(b, tmp_path):
    ran = ("fresh", b.lang, b.code.strip()) in _PRINTED  # shown word for word on another page, and run there
    run_block_once(b, tmp_path if ran else folder_for_blocks(tmp_path), 300, "fresh")


@pytest.fixture(scope="module")
def slow_folder(tmp_path_factory):
    """One folder for the slow blocks, the setup block run in it first (the main job's smaller run: what the
    MLflow blocks load). Without the committed results/quick, which that run writes afresh."""
    work = folder_for_blocks(tmp_path_factory.mktemp("doc-blocks"), with_quick=False)
    for b in BLOCKS:
        if b.kind == "setup":
            run_block(b, work, timeout=900)
    return work


@pytest.mark.slow
@pytest.mark.shared
@pytest.mark.parametrize("b", [b for b in BLOCKS if b.kind in ("slow", "setup")], ids=lambda b: b.id)
def test_a_slow_block_runs_as_written(b, slow_folder):
    if b.kind == "setup":
        return  # ran in the fixture, first
    run_block_once(b, slow_folder, 900, "slow")


# --------------------------------------------------------------------------- the front door
def test_readme_shows_the_headline_table_and_docs_the_full_ones_as_the_suite_wrote_them():
    readme, doc = README.read_text(encoding="utf-8"), RESULTS_DOC.read_text(encoding="utf-8")
    assert block(readme, "suite-headline") == (MINI / "headline.md").read_text(encoding="utf-8")
    assert block(doc, "suite-table") == (MINI / "summary.md").read_text(encoding="utf-8")
    assert block(doc, "suite-compare") == (MINI / "compare.md").read_text(encoding="utf-8")
    assert "<!-- suite-table -->" not in readme and "<!-- suite-compare -->" not in readme  # moved to docs
    assert len(readme.splitlines()) <= 250


def test_readme_starts_with_its_two_commands():
    blocks = doc_blocks(README)
    assert "pip install" in blocks[0].code and "raysent tune search_spaces/quick.yaml" in blocks[0].code
    assert blocks[1].code.strip() == "RAYSENT_DATA_DIR=../shared/data RAYSENT_MODEL_DIR=../shared/models python -m " \
                                     "pytest -q tests"
    assert not any(b.line < blocks[1].line for b in blocks[2:])


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, flags=re.M)}


@pytest.mark.parametrize("page", [README, RESULTS_DOC, REPO / "docs" / "search.md"], ids=lambda p: p.name)
def test_relative_links_resolve_to_files_and_headings(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    links = [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", text)]
    assert links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link}: no such file"
        if anchor and target.suffix == ".md":
            assert anchor in _anchors(target), f"{page.name}: {link}: no such heading in {target.name}"


# --------------------------------------------------------------------------- what the text names
def _documented_metrics() -> list[str]:
    """The parent run's metric names docs/search.md lists ("The outcome of a search", its metrics bullet), with
    ``<name>`` as sts/avg, ``<set>`` as avg and ``a|_b`` as both; the budget curve's are another test's."""
    text = (REPO / "docs" / "search.md").read_text(encoding="utf-8")
    bullet = text.split("\n- metrics: ", 1)[1].split("\n- params:", 1)[0]
    names = []
    for token in re.findall(r"`([^`\s]+)`", bullet):
        if token.startswith("budget/") or "*" in token or not re.search(r"/|_mean|_std", token):
            continue
        if token.startswith("_"):  # "(and `_std`)": the name before it with that ending
            names.append(names[-1] + token)
            continue
        token = token.replace("<name>", "sts/avg").replace("<set>", "avg")
        stem, _, alt = token.partition("|")
        names.append(stem)
        if alt:
            names.append(re.sub(r"_mean$", alt, stem) if alt.startswith("_") else alt)
    return names


@pytest.mark.parametrize("source", ["paper", "file"])
def test_the_metric_names_search_md_gives_are_the_ones_a_search_logs(source):
    """The warm-start arm's metrics are `paper/...` when its values are the method's paper defaults and `file/...`
    when the file set them (the main job logged `file/sts/avg_mean`; the page said `paper/` only)."""
    from raysent.tune.publish import outcome_metrics
    from raysent.tune.state import ArmOutcome, Best, Comparison, ScoreStat, SearchState

    arm = ArmOutcome(seeds=[1, 2], scores={"sts/avg": ScoreStat(mean=41.0, std=0.8, n=2)})
    diff = {"seeds": [1, 2], "n": 2, "diff_mean": 2.3, "diff_std": 0.1, "t_p": 0.02, "wilcoxon_p": 0.5}
    state = SearchState(run="s", phase="done", config={}, best=Best(config_id="b", dev_mean=54.3, dev_std=1.2),
                        final=arm, paper=arm, warm_source=source,
                        vs_paper=Comparison(paper="p", searched="b", tasks={"avg": diff, "dev": diff}))
    logged = outcome_metrics(state)
    documented = [n for n in _documented_metrics() if not n.startswith(("paper/", "file/")) or
                  n.startswith(f"{source}/")]
    assert f"{source}/sts/avg_mean" in documented and "sts/avg_mean" in documented
    assert sorted(set(documented) - set(logged)) == [], "docs/search.md names metrics a search does not log"
    other = "file" if source == "paper" else "paper"
    assert not [k for k in logged if k.startswith(f"{other}/")]

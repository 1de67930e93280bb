"""The users' docs ship with the project and say what the code does.

- Nothing users get (README.md, docs/*.md, the package's sources, whose docstrings and help
  texts users read) points to files outside the repository: no `shared/spec`, `shared/STYLE`.
- Every markdown link in README.md and docs/*.md resolves to a file of the repository, and
  every `#anchor` to a heading of the page it names.
- Every repository path or module the docs name (`gaca_cli/...`, `tests/...`, `bench/...`,
  `gaca_cli.log.schema`, ...) exists, and every `*.md` a source file names is a page we ship.
- docs/README.md lists every page; the layer table of docs/architecture.md lists the layers
  tests/cli/test_layering.py enforces, in its order.
- The worked example of docs/estimators.md, run as written, gives the table printed there.
"""

from __future__ import annotations

import glob
import itertools
import re
import shlex
from fractions import Fraction
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
USER_DOCS = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
THIS_FILE = Path(__file__).resolve()
SOURCES = sorted(
    p
    for folder in ("gaca_cli", "tests", "bench", "examples")
    for p in (ROOT / folder).rglob("*.py")
    if p.resolve() != THIS_FILE
)
PACKAGE_SOURCES = [p for p in SOURCES if p.is_relative_to(ROOT / "gaca_cli")]

OUTSIDE = re.compile(r"shared/spec|shared/STYLE|STYLE\.md")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.MULTILINE)
REPO_PATH = re.compile(r"`((?:gaca_cli|tests|bench|examples|schemas|docs)/[^`\s]*)`")
MODULE = re.compile(r"\b((?:gaca_cli|tests)(?:\.\w+)+)")
MD_MENTION = re.compile(r"[\w./-]*[\w-]+\.md\b")
# pages of public specifications that sources cite by bare name (not files of ours); a page
# cited with a folder that is not one of ours (apache/thrift's doc/specs/...) is not checked
EXTERNAL_PAGES = {"Encodings.md"}  # apache/parquet-format: the Parquet encodings
OUR_FOLDERS = ("docs/", "gaca_cli/", "tests/", "bench/", "examples/", "schemas/")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose(text: str) -> str:
    """Markdown without its fenced code blocks (links there are not links)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(page.read_text("utf-8")), re.MULTILINE)}


def links(page: Path) -> list[str]:
    text = prose(page.read_text("utf-8"))
    return INLINE_LINK.findall(text) + REFERENCE_LINK.findall(text)


def broken_link(page: Path, target: str) -> str | None:
    """Why a link of `page` does not resolve inside the repository (None when it does)."""
    if re.match(r"^[a-zA-Z][\w+.-]*:", target):  # https:, mailto: …: not a file of ours
        return None
    path, _, anchor = target.partition("#")
    file = page if not path else (page.parent / path).resolve()
    if not file.is_relative_to(ROOT):
        return f"{target}: outside the repository"
    if not file.exists():
        return f"{target}: no such file"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"{target}: no heading #{anchor} in {rel(file)}"
    return None


def module_exists(dotted: str) -> bool:
    """`gaca_cli.log.schema` names a module or package; a last part may be an attribute."""
    parts = dotted.split(".")
    for n in (len(parts), len(parts) - 1):
        base = ROOT.joinpath(*parts[:n])
        if n >= 2 and (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            return True
    return False


# --------------------------------------------------------------------------- nothing outside


@pytest.mark.parametrize("path", USER_DOCS + SOURCES, ids=rel)
def test_nothing_points_outside_the_repository(path):
    found = sorted({m.group(0) for m in OUTSIDE.finditer(path.read_text("utf-8"))})
    assert not found, f"{rel(path)} points outside the repository: {found}; point to docs/ instead"


def test_the_checks_see_what_they_look_for(tmp_path):
    """The patterns catch a pointer outside, a dead link, a dead anchor and a dead path."""
    assert OUTSIDE.search("see shared/spec/estimators.md") and OUTSIDE.search("(shared/STYLE.md)")
    page = DOCS / "README.md"
    assert broken_link(page, "no-such-page.md")
    assert broken_link(page, "estimators.md#no-such-heading")
    assert broken_link(page, "../../outside.md")
    assert broken_link(page, "estimators.md#the-normalisation-rule") is None
    assert broken_link(page, "https://example.org/x.md") is None
    assert links(page), "docs/README.md has no links the pattern sees"
    assert not module_exists("gaca_cli.no_such_module") and module_exists("gaca_cli.log.schema")
    assert slug("GRPO (`--method grpo`)") == "grpo---method-grpo"


# --------------------------------------------------------------------------- links and paths


@pytest.mark.parametrize("page", USER_DOCS, ids=rel)
def test_markdown_links_resolve(page):
    broken = [why for target in links(page) if (why := broken_link(page, target))]
    assert not broken, f"{rel(page)}: {broken}"


@pytest.mark.parametrize("page", USER_DOCS, ids=rel)
def test_named_paths_and_modules_exist(page):
    text = page.read_text("utf-8")
    missing = []
    for name in sorted(set(REPO_PATH.findall(text))):
        name = name.rstrip(".,;:")
        if "<" in name:  # a pattern such as tests/credit/golden/<case>.json
            continue
        if not glob.glob(str(ROOT / name)):
            missing.append(name)
    missing += sorted({m for m in MODULE.findall(text) if not module_exists(m)})
    assert not missing, f"{rel(page)} names what the repository does not have: {missing}"


@pytest.mark.parametrize("path", SOURCES, ids=rel)
def test_pages_named_in_sources_exist(path):
    """`docs/estimators.md`, or a bare `log-schema.md`, is a page we ship (`shared/...` is
    caught by test_nothing_points_outside_the_repository)."""
    missing = []
    for name in sorted(set(MD_MENTION.findall(path.read_text("utf-8"))) - EXTERNAL_PAGES):
        if "/" in name and not name.startswith(OUR_FOLDERS):
            continue
        candidates = [ROOT / name, DOCS / name, path.parent / name]
        if not any(c.is_file() for c in candidates):
            missing.append(name)
    assert not missing, f"{rel(path)} names pages the repository does not have: {missing}"


def test_the_index_lists_every_page():
    index = DOCS / "README.md"
    listed = {(index.parent / t.partition("#")[0]).resolve() for t in links(index)}
    pages = {p.resolve() for p in DOCS.glob("*.md") if p != index}
    assert pages <= listed, f"docs/README.md does not list {sorted(rel(p) for p in pages - listed)}"


def test_the_layer_table_matches_the_layering_test():
    from tests.cli.test_layering import LAYERS

    text = (DOCS / "architecture.md").read_text("utf-8")
    section = text[text.index("## The layers") :]
    table = section[: section.index("\n## ", 1)]
    rows = re.findall(r"^\| (`[\w./]+`(?:, `[\w./]+`)*) \|", table, re.MULTILINE)
    names = [tuple(n.rstrip("/").removesuffix(".py") for n in re.findall(r"`([\w./]+)`", r)) for r in rows]
    layers = [(layer,) if isinstance(layer, str) else layer for layer in LAYERS]
    assert names == [tuple(m.removeprefix("gaca_cli.") for m in layer) for layer in layers], names


# --------------------------------------------------------------------------- the worked example


def _block_after(text: str, marker: str) -> str:
    """The first fenced block after `<!-- marker -->`, without its fences."""
    rest = text[text.index(f"<!-- {marker} -->") :]
    match = re.search(r"^```[^\n]*\n(.*?)^```", rest, re.MULTILINE | re.DOTALL)
    assert match, f"no code block after {marker}"
    return match.group(1)


def _table_after(text: str, marker: str) -> list[dict[str, str]]:
    """The first markdown table after `<!-- marker -->`, one dict per row."""
    lines = text[text.index(f"<!-- {marker} -->") :].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), lines[start:]))
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in row.strip("|").split("|")))) for row in rows[2:]]


def _number(cell: str) -> float:
    return float(Fraction(cell.replace("−", "-")))


def test_the_worked_example_is_what_the_code_writes(tmp_path, monkeypatch):
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from gaca_cli.cli import app

    text = (DOCS / "estimators.md").read_text("utf-8")
    monkeypatch.chdir(tmp_path)
    exec(compile(_block_after(text, "worked-example:log"), "docs/estimators.md", "exec"), {})
    command = shlex.split(_block_after(text, "worked-example:command"))
    assert command[0] == "gaca"
    runner = CliRunner()
    result = runner.invoke(app, command[1:])
    assert result.exit_code == 0, result.output
    gaca = pq.read_table(command[command.index("-o") + 1]).to_pylist()
    # the same log and options with GiGPO (β has no part there), for the A_gigpo column
    args = command[1:]
    args[args.index("--method") + 1] = "gigpo"
    args[args.index("-o") + 1] = "gigpo.parquet"
    del args[args.index("--beta") : args.index("--beta") + 2]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    gigpo = pq.read_table("gigpo.parquet").to_pylist()

    table = _table_after(text, "worked-example:result")
    assert len(table) == len(gaca), "the table shows every row of the tiny log"
    written = {(r["traj_id"], r["step_idx"]): r for r in gaca}
    gigpo_advantage = {(r["traj_id"], r["step_idx"]): r["advantage"] for r in gigpo}
    for row in table:
        key = (row["traj_id"], int(row["step_idx"]))
        for name, cell in row.items():
            if name in ("traj_id", "step_idx"):
                continue
            got = gigpo_advantage[key] if name == "A_gigpo" else written[key][name]
            assert got == pytest.approx(_number(cell), rel=1e-12, abs=1e-15), f"{key} {name}: table {cell}, code {got}"
    # "The step group ids are 0 to 5 in order of first appearance: A/start, A/door, A/key, B/x, B/y, C/x"
    order = ["A/start", "A/door", "A/key", "B/x", "B/y", "C/x"]
    for r in gaca:
        assert r["step_group_id"] == order.index(f"{r['group_id']}/{r['anchor_obs']}")

"""Each docs/formats page says what its importer does, and a test holds it to that.

A page opens with one machine-readable line,
`<!-- claims (...): {"anchors": ..., "steps": ..., "kept": [...], "versions": [...]} -->`:

- `anchors`: "logged" (the imported fixtures have `anchor_obs`, and `gaca advantages --method
  gigpo` runs on them) or "none" (they have no anchor column, and gigpo refuses the log: the
  page must not promise anything else, e.g. "every step is its own step group");
- `steps`: "multi" (some imported trajectory has several steps) or "one" (none has);
- `kept`: columns the imported fixtures have;
- `versions`: the framework versions the fixtures were written with: each is named in the
  page's "Versions tested" section and in the fixtures' README.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from gaca_cli.integrations.imports import FORMATS
from gaca_cli.integrations.imports.base import ImportOptions
from gaca_cli.integrations.imports.core import run_import
from tests.integrations.cli_helpers import gaca
from tests.integrations.test_import_lossless import FIXTURES

ROOT = Path(__file__).parents[2]
DOCS = ROOT / "docs" / "formats"
CLAIMS = re.compile(r"<!-- claims \([^)]*\): (\{.*\}) -->")


def claims(fmt: str) -> tuple[dict, str]:
    text = (DOCS / f"{fmt}.md").read_text()
    match = CLAIMS.search(text)
    assert match, f"docs/formats/{fmt}.md has no claims line"
    return json.loads(match[1]), text


def imported(fmt: str, tmp_path: Path) -> list[Path]:
    """The fixtures of `fmt`, each imported to a log."""
    if fmt == "verl-agent":  # its files are written by gaca's exporter: write some
        from gaca_cli.integrations.verl_agent import export_rollout
        from tests.integrations.test_verl_agent_export import _rollout
        from tests.lm.tiny_models import build_tokenizer

        sources = [[export_rollout(tmp_path, *_rollout(build_tokenizer(), "numpy"), file_format="jsonl")]]
    else:
        sources = [files for f, files in FIXTURES if f == fmt]
    logs = []
    for i, files in enumerate(sources):
        out = tmp_path / f"log{i}.parquet"
        weights = (1.0, 0.5) if files[0].parent.name == "standard" else None
        assert not run_import(fmt, files, out, ImportOptions(reward_weights=weights)).violations
        logs.append(out)
    return logs


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_each_format_page_says_what_its_importer_does(tmp_path, fmt):
    claim, text = claims(fmt)
    logs = imported(fmt, tmp_path)
    tables = [pq.read_table(log) for log in logs]
    columns = set().union(*(t.column_names for t in tables))
    assert set(claim["kept"]) <= columns, set(claim["kept"]) - columns

    steps = max(max(t.column("step_idx").to_pylist()) for t in tables) + 1
    assert (steps > 1) == (claim["steps"] == "multi"), steps

    anchored = [log for log, t in zip(logs, tables, strict=True) if "anchor_obs" in t.column_names]
    gigpo = gaca("advantages", (anchored or logs)[0], "--method", "gigpo", "-o", tmp_path / "adv.parquet")
    if claim["anchors"] == "logged":
        assert "anchor_obs" in columns and gigpo.exit_code == 0, gigpo.output
    else:
        assert not {"anchor_obs", "anchor_key"} & columns
        assert gigpo.exit_code == 1 and "needs a column 'anchor_key' or 'anchor_obs'" in gigpo.stderr
        assert "own step group" not in text  # what gigpo does without anchors: it refuses

    tested = text.split("## Versions tested", 1)
    assert len(tested) == 2, f"docs/formats/{fmt}.md has no 'Versions tested' section"
    readme = (ROOT / "tests" / "data" / fmt / "README.md").read_text() if claim["versions"] else ""
    for version in claim["versions"]:
        assert version in tested[1].split("\n## ")[0] and version in readme, version

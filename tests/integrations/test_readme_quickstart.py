"""The README's path from a real framework's output to `gaca inspect` runs as written."""

from __future__ import annotations

import shlex

from tests.cli.test_docs import ROOT
from tests.integrations.cli_helpers import gaca

COMMANDS = [
    "gaca import --from trl tests/data/trl/standard --reward-weights 1,0.5 -o out/trl.parquet",
    "gaca validate out/trl.parquet --for advantages:grpo",
    "gaca advantages out/trl.parquet --method grpo -o out/trl.grpo.parquet",
    "gaca inspect out/trl.grpo.parquet",
]


def test_the_four_commands_are_in_the_readme_and_run(tmp_path, monkeypatch):
    readme = (ROOT / "README.md").read_text()
    assert "\n".join(COMMANDS) in readme
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tests" / "data").mkdir(parents=True)
    (tmp_path / "tests" / "data" / "trl").symlink_to(ROOT / "tests" / "data" / "trl")
    for command in COMMANDS:
        args = shlex.split(command)[1:]
        res = gaca(*args, *(["--no-pager"] if args[0] == "inspect" else []))
        assert res.exit_code == 0, (command, res.output)
    assert "method grpo" in res.stdout and "12" in res.stdout


def test_the_readme_table_lists_every_format():
    from gaca_cli.integrations.imports import FORMATS

    readme = (ROOT / "README.md").read_text()
    for name in FORMATS:
        assert f"| `{name}` |" in readme, name

"""One exit status per output-path mistake, whichever command makes it.

Every command that writes (`advantages`, `score`, `import`: a file; `train-offline`: a
directory) checks its -o before any work. An -o that would overwrite an input or fall inside
an input directory is a usage error (exit 2, as for any bad option); an -o that cannot be
written where it points (an existing directory where a file goes, an existing file where a
directory goes, a path under a regular file) is exit 1 with one `Error:` line. Nothing is
written in either case.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from tests.log.test_checks import base_rows, to_table

runner = CliRunner()

COMMANDS = {  # the command line before -o, and whether -o names a directory
    "advantages": (["advantages", "{log}", "--method", "grpo"], False),
    "score": (["score", "{log}", "--model", "no-such-model"], False),
    "import": (["import", "--from", "chat-jsonl", "{log}"], False),
    "train-offline": (["train-offline", "{log}", "--model", "no-such-model"], True),
}
# mistake: (exit status, what -o is, given the input and a folder of other things)
MISTAKES = {
    "the input": 2,
    "inside an input directory": 2,
    "under a regular file": 1,
    "the wrong kind": 1,  # an existing directory for a file, an existing file for a directory
}


def _setup(tmp_path: Path, command: str, mistake: str) -> tuple[list[str], str]:
    args, is_dir = COMMANDS[command]
    folder = tmp_path / "logs"
    folder.mkdir()
    log = folder / ("log.jsonl" if command == "import" else "log.parquet")
    if command == "import":
        log.write_text('{"messages": [{"role": "user", "content": "hi"}], "reward": 1.0}\n')
    else:
        pq.write_table(to_table(base_rows()), log)
    (tmp_path / "notes.txt").write_text("a file\n")
    (tmp_path / "existing").mkdir()
    source = str(folder) if mistake == "inside an input directory" else str(log)
    out = {
        "the input": str(log),
        "inside an input directory": str(folder / ("new" if is_dir else "new.parquet")),
        "under a regular file": str(tmp_path / "notes.txt" / "out"),
        "the wrong kind": str(tmp_path / ("notes.txt" if is_dir else "existing")),
    }[mistake]
    return [a.format(log=source) for a in args] + ["-o", out], out


def _listing(root: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(root)), p.stat().st_size if p.is_file() else -1) for p in root.rglob("*"))


@pytest.mark.parametrize("mistake", list(MISTAKES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_output_mistake_has_one_exit_status_in_every_command(tmp_path, command, mistake):
    args, out = _setup(tmp_path, command, mistake)
    before = _listing(tmp_path)
    res = runner.invoke(app, args)
    assert res.exit_code == MISTAKES[mistake], (command, mistake, res.output)
    if res.exit_code == 1:
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: -o ") and out in lines[0], res.stderr
    else:
        assert "-o" in res.stderr and "input" in res.stderr, res.stderr
    assert _listing(tmp_path) == before
    assert not any(name.endswith((".tmp", ".parts")) for name in os.listdir(tmp_path))

"""The README's option tables are made from the commands' configs (gaca_cli/cli/option_tables.py),
so they say what `--help` says; `make lint` runs the same check with `--check`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

import pytest

from gaca_cli.cli.option_tables import MARKED, command_configs, main, option_table, render
from gaca_cli.cli.options import option_fields

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_tables_are_the_configs_tables():
    text = README.read_text(encoding="utf-8")
    assert {m[2] for m in MARKED.finditer(text)} >= {"advantages"}
    assert render(text) == text, "run: python -m gaca_cli.cli.option_tables"


def test_every_command_with_a_config_has_a_table_of_all_its_options():
    configs = command_configs()
    assert set(configs) == {"advantages", "score", "train-offline", "inspect", "demo"}
    for command, cls in configs.items():
        rows = option_table(cls).splitlines()[2:]
        assert len(rows) == len(option_fields(cls)), command
        assert all(row.count(" | ") == 2 for row in rows), command  # a `|` inside a cell is escaped


@dataclasses.dataclass(frozen=True)
class Toy:
    name: str = dataclasses.field(metadata={"help": "Required text.", "short": "-n"})
    scope: Literal["a", "b"] = dataclasses.field(default="a", metadata={"help": "Either | or."})
    level: Literal[1, 2] | None = dataclasses.field(default=None, metadata={"help": "Levels.", "default_text": "1 (a)"})
    rate: float = dataclasses.field(default=1e-06, metadata={"help": "A rate."})
    fast: bool = dataclasses.field(default=True, metadata={"help": "On."})
    loud: bool = dataclasses.field(default=False, metadata={"help": "Off."})
    tags: tuple[Literal["x", "y"], ...] = dataclasses.field(
        default=("x",), metadata={"help": "Tags.", "metavar": "T,..."}
    )
    top: int | None = dataclasses.field(default=None, metadata={"help": "Top.", "metavar": "K"})
    internal: int = 0


def test_a_table_row_per_kind_of_field():
    assert option_table(Toy).splitlines() == [
        "| option | default | meaning |",
        "|---|---|---|",
        "| `-n`, `--name` | required | Required text. |",
        "| `--scope a\\|b` | a | Either \\| or. |",
        "| `--level 1\\|2` | 1 (a) | Levels. |",
        "| `--rate` | 1e-06 | A rate. |",
        "| `--fast`, `--no-fast` | on | On. |",
        "| `--loud` | off | Off. |",
        "| `--tags T,...` | x | Tags. |",
        "| `--top K` | none | Top. |",
    ]


def test_check_finds_a_drifted_table_and_the_rewrite_mends_it(tmp_path, capsys):
    readme = tmp_path / "README.md"
    table = option_table(command_configs()["inspect"])
    good = f"# x\n\n<!-- options: inspect -->\n{table}<!-- /options -->\n\nafter\n"
    readme.write_text(good.replace("Key of --top.", "Key of the top."), encoding="utf-8")
    assert main([str(readme), "--check"]) == 1
    assert "differ" in capsys.readouterr().out
    assert main([str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == good
    assert main([str(readme), "--check"]) == 0


def test_a_marker_naming_no_command_is_an_error():
    with pytest.raises(ValueError, match="options: no-such -->: no such command"):
        render("<!-- options: no-such -->\n<!-- /options -->\n")

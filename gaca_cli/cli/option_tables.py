"""`python -m gaca_cli.cli.option_tables [--check] [README.md]`: the README's option tables made
from the commands' config fields, as `--help` is, so that the two cannot drift apart (`make lint`
checks). Each stands between `<!-- options: COMMAND -->` and `<!-- /options -->`: a row per option
field with its flags (and its choices or metadata `metavar`), default and help text."""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from pathlib import Path

from gaca_cli.cli.options import choices_of, names_of, negatable, option_fields

MARKED = re.compile(r"(<!-- options: ([\w-]+) -->\n)(.*?)(<!-- /options -->)", re.S)


def command_configs() -> dict[str, type]:
    """{command name: its config class} for every command whose options come from a config."""
    from gaca_cli.cli import app

    return {
        info.name or info.callback.__name__.replace("_", "-"): info.callback.config_class  # type: ignore[union-attr]
        for info in app.registered_commands
        if hasattr(info.callback, "config_class")
    }


def _default(field: dataclasses.Field) -> str:
    value = field.metadata.get("default_text", field.default)
    if isinstance(value, tuple):
        value = ",".join(map(str, value)) or None
    named = [(dataclasses.MISSING, "required"), (True, "on"), (False, "off"), (None, "none")]
    return next((word for v, word in named if value is v), str(value))


def option_table(config_class: type) -> str:
    """The Markdown table (option, default, meaning) of a config's option fields."""
    hints = typing.get_type_hints(config_class)
    rows = ["| option | default | meaning |", "|---|---|---|"]
    for f in option_fields(config_class):
        names = names_of(f) + ([f"--no-{f.name.replace('_', '-')}"] if negatable(f, hints[f.name]) else [])
        listed = typing.get_origin(hints[f.name]) is tuple  # a comma-separated list: its help says so
        value = f.metadata.get("metavar") or ("" if listed else "|".join(map(str, choices_of(hints[f.name]))))
        names[-1] += f" {value}" if value else ""
        cells = [", ".join(f"`{n}`" for n in names), _default(f), f.metadata["help"]]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def render(text: str) -> str:
    """`text` (a README) with every marked table made again from its command's config."""
    configs = command_configs()

    def table(match: re.Match) -> str:
        if match[2] not in configs:
            raise ValueError(f"<!-- options: {match[2]} -->: no such command; use one of {', '.join(configs)}")
        return match[1] + option_table(configs[match[2]]) + match[4]

    return MARKED.sub(table, text)


def main(argv: list[str]) -> int:
    path = Path(next((a for a in argv if a != "--check"), "README.md"))
    text = path.read_text(encoding="utf-8")
    if (made := render(text)) != text:
        if "--check" in argv:
            print(f"{path}: the option tables differ from the configs; run python -m gaca_cli.cli.option_tables")
            return 1
        path.write_text(made, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

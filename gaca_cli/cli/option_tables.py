"""The README's option tables, made from the commands' config fields (as `--help` is), so that
the two say the same and cannot drift apart.

    python -m gaca_cli.cli.option_tables           # rewrite the tables in README.md
    python -m gaca_cli.cli.option_tables --check   # exit 1 where a table differs (make lint)

A table stands between `<!-- options: COMMAND -->` and `<!-- /options -->`: one row per option
field, in field order, with its flags (and a choice's values, or the metadata `metavar`), its
default (the metadata `default_text` where there is one) and its help text.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import typing
from pathlib import Path

from gaca_cli.cli.options import choices_of, names_of, option_fields

MARKED = re.compile(r"(<!-- options: ([\w-]+) -->\n)(.*?)(<!-- /options -->)", re.S)


def command_configs() -> dict[str, type]:
    """{command name: its config class} for every command whose options come from a config."""
    from gaca_cli.cli import app

    found = {}
    for info in app.registered_commands:
        if (config_class := getattr(info.callback, "config_class", None)) is not None:
            name = info.name or typing.cast(typing.Any, info.callback).__name__.replace("_", "-")
            found[name] = config_class
    return found


def _default(field: dataclasses.Field) -> str:
    value = field.metadata.get("default_text", field.default)
    if value is dataclasses.MISSING:
        return "required"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "none"
    return "none" if value is None else str(value)


def option_table(config_class: type) -> str:
    """The Markdown table (option, default, meaning) of a config's option fields."""
    hints = typing.get_type_hints(config_class)
    rows = ["| option | default | meaning |", "|---|---|---|"]
    for f in option_fields(config_class):
        names = names_of(f)
        if f.default is True:
            names.append(f"--no-{names[-1][2:]}")
        choices = choices_of(hints[f.name])
        value = f.metadata.get("metavar") or (
            "" if typing.get_origin(hints[f.name]) is tuple else "|".join(map(str, choices))
        )
        if value:
            names[-1] += " " + value
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
    check = "--check" in argv
    path = Path(next((a for a in argv if a != "--check"), "README.md"))
    text = path.read_text(encoding="utf-8")
    made = render(text)
    if made == text:
        return 0
    if check:
        print(f"{path}: the option tables differ from the configs; run python -m gaca_cli.cli.option_tables")
        return 1
    path.write_text(made, encoding="utf-8")
    print(f"{path}: option tables rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

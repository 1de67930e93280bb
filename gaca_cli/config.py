"""What every command's frozen config dataclass shares: the error its validation raises, and
when an option does nothing given the others. Standard library only: every layer's configs
use it, and the command line turns a ConfigError into a usage error (`cli/options.py`)."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid configuration value; `field` names the offending parameter (the command line
    reports it as a usage error naming that field's option)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def inactive_because(config: object, name: str) -> str | None:
    """When the option `name` of a config dataclass does nothing with its other options (its
    field metadata `only`: (other field, its values) or (other field, "given")): what it needs,
    e.g. "--method gaca"; None when it acts, or acts always."""
    from dataclasses import fields

    f = next(g for g in fields(config) if g.name == name)  # type: ignore[arg-type]
    if "only" not in f.metadata:
        return None
    other, wanted = f.metadata["only"]
    value = getattr(config, other)
    flag = "--" + other.replace("_", "-")
    if wanted == "given":
        default = next(g.default for g in fields(config) if g.name == other)  # type: ignore[arg-type]
        return None if value != default else f"{flag} is given"
    return None if value in wanted else f"{flag} {' or '.join(wanted)}"

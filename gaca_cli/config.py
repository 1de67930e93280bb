"""What every command's frozen config dataclass shares: the error its validation raises, the
check of its `Literal[...]` choice fields, when an option does nothing given the others, and
a config built from the library's keyword options (`options_config`).
Standard library only: every layer's configs use it, and the command line turns a ConfigError
into a usage error (`cli/options.py`)."""

from __future__ import annotations

import difflib
import functools
import typing
from collections.abc import Mapping
from dataclasses import fields
from typing import Any, NoReturn


class ConfigError(ValueError):
    """An invalid configuration value; `field` names the offending parameter (the command line
    reports it as a usage error naming that field's option)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


def invalid(config: object, name: str, use: str) -> NoReturn:
    """Raise the ConfigError of the field `name` of `config`: its value is not valid, `use`
    says what to give instead."""
    raise ConfigError(name, f"{name} = {getattr(config, name)!r} is not valid; use {use}")


def choices_of(hint: object) -> tuple:
    """The values of a `Literal[...]`, also in `Literal[...] | None` or `tuple[Literal[...], ...]`; else ()."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    return next(filter(None, map(choices_of, typing.get_args(hint))), ())


@functools.cache
def _choice_fields(config_class: type) -> dict[str, tuple[tuple, bool]]:
    """{field: (its choices, whether None is allowed)} for the fields typed `Literal[...]`."""
    hints = typing.get_type_hints(config_class)
    found = {f.name: choices_of(hints[f.name]) for f in fields(config_class)}
    return {name: (c, type(None) in typing.get_args(hints[name])) for name, c in found.items() if c}


def check_choices(config: object) -> None:
    """Raise ConfigError, naming the field, where a `Literal[...]` field holds another value."""
    for name, (allowed, optional) in _choice_fields(type(config)).items():  # type: ignore[arg-type]
        value = getattr(config, name)
        values = value if isinstance(value, tuple) else (value,)
        if any(v not in allowed and not (v is None and optional) for v in values):
            use = (", " if isinstance(value, tuple) else " | ").join(map(str, allowed))
            raise ConfigError(name, f"{name} = {','.join(map(str, values))!r} is not valid; use {use}")


def inactive_because(config: object, name: str) -> str | None:
    """When the option `name` of a config dataclass does nothing with its other options (its
    field metadata `only`: (other field, its values) or (other field, "given")): what it needs,
    e.g. "--method gaca"; None when it acts, or acts always."""
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


def options_config(config_class: type, options: Mapping[str, Any], **fixed: Any) -> Any:
    """A command's config from keyword options (`beta=0.3`), refused as on the command line: an
    unknown option (TypeError), a bad value or one with no effect (ValueError), named."""
    names = [f.name for f in fields(config_class) if "help" in f.metadata and f.name not in fixed]
    unknown = sorted(set(options) - set(names))
    if unknown:
        close = difflib.get_close_matches(unknown[0], names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise TypeError(f"unknown option {unknown[0]!r}; {hint}the options are: {', '.join(names)}")
    config = config_class(**{**options, **fixed})
    for name, value in options.items():
        default = next(f.default for f in fields(config_class) if f.name == name)
        if value != default and (unless := inactive_because(config, name)) is not None:
            raise ValueError(f"{name}={value!r} has no effect unless {unless.lstrip('-').replace('-', '_')}; drop it")
    return config

"""Command-line options made from a config dataclass, so that each option is written once.

A field of a command's config becomes an option when its metadata has a `help` text:

    beta: float = field(default=0.1, metadata={"help": "β: how strongly NLL moves λ ..."})

gives `--beta FLOAT` with that help and default. The rest follows from the field:

- the flag is the field's name with dashes (`step_weight` -> `--step-weight`); metadata
  `short` adds a one-letter alias (`-m`), `metavar` names the value in the help;
- a field without a default is a required option;
- a bool that defaults to True is `--name/--no-name`, one that defaults to False is `--name`
  (`--name/--no-name` too with metadata `negatable`);
- a field typed `Literal[...]` is a choice: `--help` and shell completion list its values;
- a `tuple[str, ...]` (or of a `Literal`) is given as a comma-separated list (`--compare grpo,gaca`);
- int and float values that do not parse are usage errors that quote the value;
- metadata `default_text` is the default shown where the value would not say it (`norm`: None).

Validation stays in the config's `__post_init__` (choices too: `check_choices`, for library
callers), which raises `ConfigError(field, message)`;
`ConfigOptions.build` turns it into a usage error (exit status 2) naming the field's flag.
An option that acts only with some value of another (`--beta` only with `--method gaca`) says
so in its metadata, `only: (other field, its values)` or `(other field, "given")`; given on
the command line without that, it is a usage error too, rather than silently doing nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, Generic, TypeVar

import typer

from gaca_cli.config import ConfigError, choices_of, inactive_because

T = TypeVar("T")


def option_fields(config_class: type) -> list[dataclasses.Field]:
    """The fields of `config_class` that are command-line options (those with a help text)."""
    return [f for f in dataclasses.fields(config_class) if "help" in f.metadata]


def flag_of(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def names_of(field: dataclasses.Field) -> list[str]:
    """The option's names: its short alias (metadata `short`), if any, then its flag."""
    return [field.metadata["short"], flag_of(field)] if "short" in field.metadata else [flag_of(field)]


def split_list(text: str | None) -> tuple[str, ...]:
    """`a, b,c` -> ("a", "b", "c"); blanks dropped."""
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def _number_parser(kind: type, default: object) -> Callable[[Any], Any]:
    noun = "an integer" if kind is int else "a number"
    example = f"e.g. {default}" if isinstance(default, (int, float)) and not isinstance(default, bool) else "e.g. 1"

    def parse(text: Any) -> Any:
        if isinstance(text, kind):
            return text
        try:
            return kind(text)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{text!r} is not {noun}; use {noun}, {example}") from None

    return parse


def _is_str_tuple(hint: Any) -> bool:
    return typing.get_origin(hint) is tuple and (typing.get_args(hint) == (str, ...) or bool(choices_of(hint)))


def _number_kind(hint: Any) -> type | None:
    """int or float for `int`, `float`, `int | None`, `float | None`; else None."""
    kinds = {a for a in typing.get_args(hint) if a is not type(None)} if typing.get_args(hint) else {hint}
    if len(kinds) == 1 and (kind := next(iter(kinds))) in (int, float):
        return kind
    return None


def negatable(field: dataclasses.Field, hint: Any) -> bool:
    """Whether a bool option also gets `--no-NAME`: on by default, or marked so."""
    return hint is bool and (field.default is True or bool(field.metadata.get("negatable")))


def _parameter(field: dataclasses.Field, hint: Any) -> inspect.Parameter:
    """The typer parameter of one config field."""
    meta = field.metadata
    default = ... if field.default is dataclasses.MISSING else field.default
    extra: dict[str, Any] = {}
    decls = names_of(field)
    if negatable(field, hint):
        decls[-1] += f"/--no-{decls[-1][2:]}"
    if _is_str_tuple(hint):
        hint = str | None
        if default is not ...:
            default = ",".join(default) or None
    elif choices := choices_of(hint):  # typer offers the choices; the config's check words the refusal
        extra["parser"] = lambda text: next((c for c in choices if str(c) == str(text)), text)
    elif (kind := _number_kind(hint)) is not None:
        extra["parser"] = _number_parser(kind, default)
    show = meta.get("default_text", True)
    option = typer.Option(*decls, help=meta["help"], metavar=meta.get("metavar"), show_default=show, **extra)
    return inspect.Parameter(
        field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[hint, option]
    )


@dataclasses.dataclass(frozen=True)
class ConfigOptions(Generic[T]):
    """The values given for a config's options; `build()` makes the validated config."""

    config_class: type[T]
    values: dict[str, Any]

    def build(self, **more: Any) -> T:
        """The config from the options (and `more`, fields the command supplies itself). An
        invalid value is a usage error (exit status 2) that names the option."""
        hints = {f.name: " / ".join(f"'{n}'" for n in names_of(f)) for f in option_fields(self.config_class)}
        try:
            config = self.config_class(**self.values, **more)
        except ConfigError as exc:
            raise typer.BadParameter(str(exc), param_hint=hints.get(exc.field)) from None
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
        for f in option_fields(self.config_class):
            if "only" in f.metadata and self.values.get(f.name, f.default) != f.default:
                if (unless := inactive_because(config, f.name)) is not None:
                    value = self.values[f.name]
                    shown = ",".join(value) if isinstance(value, tuple) else value
                    raise typer.BadParameter(
                        f"{f.name} = {shown} has no effect unless {unless}; drop it", param_hint=hints[f.name]
                    )
        return config


def config_options(config_class: type[T]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator (below `@app.command()`): one option per option field of `config_class`,
    placed where the command declares its `options` parameter; the command receives them as
    a `ConfigOptions` and calls `options.build()`."""
    fields = option_fields(config_class)
    hints = typing.get_type_hints(config_class)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(command, eval_str=True).parameters
        if "options" not in own:
            raise TypeError(f"{command.__name__} needs an `options` parameter for the {config_class.__name__} options")
        params: list[inspect.Parameter] = []
        for name, param in own.items():
            if name == "options":
                params.extend(_parameter(f, hints[f.name]) for f in fields)
            else:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def run(**given: Any) -> Any:
            values = {f.name: given.pop(f.name) for f in fields}
            for f in fields:
                if _is_str_tuple(hints[f.name]):
                    given_text = values[f.name]
                    values[f.name] = split_list(given_text)
                    if given_text is not None and not values[f.name]:  # "," or "": not the same as leaving it out
                        raise typer.BadParameter(
                            f"{given_text!r} names nothing; use a comma-separated list of names",
                            param_hint=" / ".join(f"'{n}'" for n in names_of(f)),
                        )
            return command(options=ConfigOptions(config_class, values), **given)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.config_class = config_class  # type: ignore[attr-defined]  # for option_tables
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate

"""The options of `gaca inspect` that choose what is computed: one frozen dataclass whose fields
carry each option's default, help text and (in `__post_init__`) validation.

Kept apart from `gaca_cli.inspect.data` (pyarrow, the log checks) so that the command line
reads these options without importing any of that (`gaca --help` stays fast).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from gaca_cli.config import ConfigError, check_choices
from gaca_cli.credit.config import METHODS, Method

DEFAULT_TOP = 10  # rows of --top / rank movers of --compare when no K is given


@dataclass(frozen=True)
class InspectConfig:
    """Every option of `gaca inspect` that chooses what is computed (not how it is drawn).

    traj / group: show one trajectory / one episode group (ids compared as text).
    top: the K most extreme steps; by: their key (default abs-advantage); lowest: the K
    smallest instead of the largest. compare: recompute these methods (two or more) with the
    file's parameters and show how they differ; `top` is then the number of rank movers.
    """

    traj: str | None = field(default=None, metadata={"help": "Show every step of this trajectory."})
    group: str | None = field(default=None, metadata={"help": "Show every step of this episode group."})
    top: int | None = field(
        default=None,
        metadata={"help": f"Show the K most extreme steps (default {DEFAULT_TOP} with --by).", "metavar": "K"},
    )
    by: Literal["nll", "weight", "advantage", "abs-advantage"] | None = field(
        default=None, metadata={"help": "Key of --top.", "default_text": "abs-advantage"}
    )
    lowest: bool = field(default=False, metadata={"help": "With --top: the K smallest values instead of the largest."})
    compare: tuple[Method, ...] = field(
        default=(),
        metadata={
            "help": f"Recompute these methods with the file's parameters and compare them, e.g. {','.join(METHODS)}.",
            "metavar": "M1,M2,...",
        },
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if self.traj is not None and self.group is not None:
            raise ConfigError(
                "traj", f"traj = {self.traj!r} and group = {self.group!r} are both set; use one of --traj or --group"
            )
        if self.top is not None and self.top < 1:
            raise ConfigError("top", f"top = {self.top!r} is not valid; use a number of steps ≥ 1, e.g. --top 10")
        if self.compare:
            if len(set(self.compare)) != len(self.compare) or len(self.compare) < 2:
                raise ConfigError(
                    "compare",
                    f"compare = {','.join(self.compare)!r} is not valid; use two or more different methods, "
                    f"e.g. --compare {','.join(METHODS)}",
                )
            if self.by is not None or self.lowest:
                name, value = ("by", self.by) if self.by is not None else ("lowest", self.lowest)
                raise ConfigError(
                    name, f"{name} = {value!r} has no effect with compare (it ranks steps by advantage); drop --{name}"
                )

    @property
    def view(self) -> str:
        """overview | steps | top | compare."""
        if self.compare:
            return "compare"
        if self.top is not None or self.by is not None or self.lowest:
            return "top"
        if self.traj is not None or self.group is not None:
            return "steps"
        return "overview"

    @property
    def k(self) -> int:
        return DEFAULT_TOP if self.top is None else self.top

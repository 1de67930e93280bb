"""The one progress display of every command: a rich bar per stage, on stderr.

The bars are drawn only when stderr is a terminal (and, under torchrun / accelerate, only by
rank 0); they are removed when the command ends, so stderr keeps only the summary and stdout
only data. Colour follows the console (`NO_COLOR` honoured). The library reports progress
through callbacks; the adapters below turn each command's callbacks into `update` calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn


class ProgressBar:
    """`with ProgressBar(console) as bar: bar.update(stage, done, total, info)`.

    Each stage gets its own bar on first sight. `echo_when_hidden`: where no bar is drawn,
    write each update as one `stage: info` line instead (for runs of minutes whose stderr
    goes to a log file).
    """

    def __init__(self, console: Console, *, enabled: bool = True, echo_when_hidden: bool = False) -> None:
        self.console = console
        self.visible = enabled and console.is_terminal
        self._echo = enabled and echo_when_hidden and not self.visible
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not self.visible,
        )
        self._tasks: dict[str, TaskID] = {}

    def __enter__(self) -> ProgressBar:
        self._progress.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.__exit__(kind, exc, tb)

    def update(self, stage: str, done: int, total: int | None = None, info: str = "") -> None:
        """Move the bar of `stage` to `done` of `total` (a new stage starts a new bar)."""
        if stage not in self._tasks:
            self._tasks[stage] = self._progress.add_task(stage, total=total, completed=done, info=info)
        self._progress.update(self._tasks[stage], completed=done, total=total, info=info)
        if self._echo and info:
            self.console.print(f"{stage}: {info}", markup=False, highlight=False)

    def stop(self) -> None:
        """Remove the bars now (before printing a message of one's own)."""
        self._progress.stop()


class ScoreProgress:
    """`gaca score`'s hooks (`gaca_cli.lm.scoring.Progress`): rows scored, tokens/s and ETA."""

    stage = "scoring"

    def __init__(self, bar: ProgressBar) -> None:
        self.bar = bar
        self.rows = self.tokens = self.total = 0
        self._t0 = time.perf_counter()

    def start(self, total_rows: int) -> None:
        self.total = total_rows
        self._t0 = time.perf_counter()
        self.bar.update(self.stage, 0, total_rows, "rows")

    def advance(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        elapsed = time.perf_counter() - self._t0
        rate = f"  {self.tokens / elapsed:,.0f} tok/s" if elapsed > 0 and self.tokens else ""
        self.bar.update(self.stage, self.rows, self.total, "rows" + rate)


def train_event(bar: ProgressBar) -> Callable[[str, dict], None]:
    """`gaca train-offline`'s `on_event(kind, info)`: the reference log-probs pass, then
    optimiser steps with loss, KL, clip fraction, largest ratio and tokens/s."""

    def on_event(kind: str, info: dict) -> None:
        if kind == "reference":
            bar.update("reference log-probs", info["done"], info["total"])
        elif kind == "start":
            bar.update("training", info["start_step"], info["total_steps"])
        elif kind == "step":
            parts = [f"loss {info['loss']:.4f}"] if info.get("loss") is not None else []
            for key, label in (("kl", "kl"), ("clip_frac", "clip"), ("ratio_max", "r_max")):
                if info.get(key) is not None:
                    parts.append(f"{label} {info[key]:.3g}")
            if info.get("tokens_per_s"):
                parts.append(f"{info['tokens_per_s']:,.0f} tok/s")
            bar.update("training", info["step"], None, "  ".join(parts))

    return on_event

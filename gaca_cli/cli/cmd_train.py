"""`gaca train-offline`: an offline policy update from a log annotated with advantages."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, MapOption, check_output, column_map, err_console, show_summary, user_errors
from gaca_cli.cli.options import ConfigOptions, config_options
from gaca_cli.interrupts import is_interruption, report_interruption
from gaca_cli.lm.train_config import TrainConfig


@app.command("train-offline")
@config_options(TrainConfig)
def train_offline(
    logs: list[Path] = typer.Argument(
        ..., metavar="ANNOTATED...", help="Log(s) with an advantage column (from `gaca advantages`)."
    ),
    output: Path = typer.Option(
        ..., "-o", "--output", metavar="OUT_DIR", help="Directory for the trained model, checkpoints and metrics.jsonl."
    ),
    *,
    options: ConfigOptions[TrainConfig],
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the run in OUT_DIR from its latest checkpoint (a new or empty OUT_DIR starts it).",
    ),
    column_maps: list[str] = MapOption,
    as_json: bool = JsonOption,
) -> None:
    """Update a policy offline from logged steps and their advantages.

    Writes to OUT_DIR a model that transformers loads (or a LoRA adapter), periodic
    checkpoints and metrics.jsonl (one line per optimiser step). ppo needs the behavior
    policy's token log-probs: behavior_logprobs, or token_logprobs from `gaca score
    --token-logprobs` with the starting model. Several GPUs: accelerate launch -m gaca_cli
    train-offline … (or torchrun --nproc-per-node N -m gaca_cli train-offline …).

    Example: gaca train-offline annotated.parquet --model ./policy --loss ppo --lora-r 16 --lr 1e-4 -o runs/ppo
    """
    config = options.build()
    from gaca_cli.cli.progress import ProgressBar, train_event
    from gaca_cli.files import same_or_inside
    from gaca_cli.lm.checkpoints import check_out_dir
    from gaca_cli.lm.training import train
    from gaca_cli.log.reading import read_log
    from gaca_cli.render import train_summary

    if (clash := same_or_inside(output, logs)) is not None:  # first: exit 2, as other commands' -o
        raise typer.BadParameter(f"{output} would overwrite or fall inside the input {clash}", param_hint="'-o'")
    check_output(output, directory=True)
    try:
        check_out_dir(output, resume)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'-o'") from None
    with user_errors():
        log = read_log(logs, column_map(column_maps))
        with ProgressBar(err_console(), enabled=os.environ.get("RANK", "0") == "0") as bar:
            try:
                result = train(log, config, output, resume=resume, on_event=train_event(bar))
            except (KeyboardInterrupt, Exception) as exc:
                if not is_interruption(exc):
                    raise
                bar.stop()
                report_interruption(f"continue with the same command and --resume ({output})")
    if result.is_main_process:
        show_summary(result.summary, train_summary, as_json=as_json)

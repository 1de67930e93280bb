"""`gaca score`: the NLL of every logged action under a causal LM, written as new columns."""

from __future__ import annotations

from pathlib import Path

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, MapOption, column_map, err_console, output_path, show_summary, user_errors
from gaca_cli.cli.options import ConfigOptions, config_options
from gaca_cli.interrupts import is_interruption, report_interruption
from gaca_cli.lm.score_config import ScoreConfig


@app.command("score")
@config_options(ScoreConfig)
def score(
    logs: list[Path] = typer.Argument(..., metavar="LOG...", help="Parquet files, globs or directories."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output Parquet file (default: LOG.scored.parquet beside LOG)."
    ),
    *,
    options: ConfigOptions[ScoreConfig],
    column_maps: list[str] = MapOption,
    as_json: bool = JsonOption,
) -> None:
    """Score every logged action: nll_sum, nll_mean, n_action_tokens (and token_logprobs).

    Append-only histories are scored with one forward per trajectory. Work is kept in
    OUT.parts/ until OUT is complete; --resume continues an interrupted run. Several GPUs:
    torchrun --nproc-per-node N -m gaca_cli score … (rank 0 merges).

    Example: gaca score rollouts.parquet --model Qwen/Qwen2.5-0.5B-Instruct -o scored.parquet
    """
    config = options.build()
    out = output_path(logs, output, "scored")
    from gaca_cli.api import run_score
    from gaca_cli.cli.progress import ProgressBar, ScoreProgress
    from gaca_cli.lm.shards import distributed_from_env
    from gaca_cli.log.reading import read_log
    from gaca_cli.render import score_summary

    with user_errors(), distributed_from_env() as (rank, world, barrier, agree):
        log = read_log(logs, column_map(column_maps))
        with ProgressBar(err_console(), enabled=rank == 0) as bar:
            try:
                result = run_score(
                    log,
                    config,
                    out,
                    rank=rank,
                    world=world,
                    barrier=barrier,
                    agree=agree,
                    progress=ScoreProgress(bar),
                )
            except (KeyboardInterrupt, Exception) as exc:
                if not is_interruption(exc):
                    raise
                bar.stop()
                kept = None  # rank 0 says what is kept
                if rank == 0:
                    from gaca_cli.lm.shards import work_dir_for

                    parts = work_dir_for(out)
                    if any(parts.glob("*.parquet")):
                        kept = f"finished chunks are kept in {parts}/: continue with the same command and --resume"
                    else:  # only the manifest: nothing worth resuming
                        from gaca_cli.files import discard_dir

                        discard_dir(parts, out)
                        kept = "no chunk was finished, so nothing is kept"
                report_interruption(kept)
    if rank == 0:
        show_summary(result.summary, score_summary, as_json=as_json)

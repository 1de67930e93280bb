"""`gaca score`: the NLL of every logged action under a causal LM, written as new columns."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import (
    JsonOption,
    MapOption,
    build_config,
    column_map,
    err_console,
    output_path,
    print_json,
    user_errors,
)
from gaca_cli.lm.scoring import CONTEXT_SOURCES, ScoreConfig

_D = ScoreConfig(model="-")


@app.command("score")
def score(
    logs: list[Path] = typer.Argument(..., metavar="LOG...", help="Parquet files, globs or directories."),
    model: str = typer.Option(..., "--model", "-M", help="A local model directory or a hub id (HF_HUB_OFFLINE honoured)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Output Parquet file (default: LOG.scored.parquet beside LOG)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit)."),
    dtype: str = typer.Option(_D.dtype, "--dtype", help="auto | bf16 | fp16 | fp32 (auto: bf16 on CUDA, fp32 elsewhere)."),
    device: str = typer.Option(_D.device, "--device", help="auto | cpu | cuda | cuda:N | mps."),
    trust_remote_code: bool = typer.Option(_D.trust_remote_code, "--trust-remote-code", help="Run the model repository's own Python code."),
    temperature: float = typer.Option(_D.temperature, "--temperature", "-T", help="Divide logits by T (the behavior policy's sampling temperature)."),
    token_logprobs: bool = typer.Option(_D.token_logprobs, "--token-logprobs", help="Also write token_logprobs (list<float32>)."),
    context: str = typer.Option(_D.context, "--context", help=f"Context from: {' | '.join(CONTEXT_SOURCES)} (auto: token ids, else prompt, else messages)."),
    add_special_tokens: bool = typer.Option(_D.add_special_tokens, "--add-special-tokens", help="Let the tokenizer add its special tokens (BOS) to a `prompt` text."),
    strict_prefix: bool = typer.Option(_D.strict_prefix, "--strict-prefix", help="Stop with an error where the context's tokens are not a prefix of context + action's."),
    pack: bool = typer.Option(_D.pack, "--pack/--no-pack", help="One forward per append-only trajectory (no effect on the numbers)."),
    max_batch_tokens: int = typer.Option(_D.max_batch_tokens, "--max-batch-tokens", help="Padded tokens per forward (halved on out-of-memory)."),
    chunk_rows: int = typer.Option(_D.chunk_rows, "--chunk-rows", help="Rows per resumable chunk in the work directory OUT.parts/."),
    resume: bool = typer.Option(_D.resume, "--resume", help="Continue an interrupted run from the chunks in OUT.parts/."),
    column_maps: list[str] = MapOption,
    as_json: bool = JsonOption,
) -> None:
    """Score every logged action: nll_sum, nll_mean, n_action_tokens (and token_logprobs).

    Append-only histories are scored with one forward per trajectory. Work is kept in
    OUT.parts/ until OUT is complete; --resume continues an interrupted run. Several GPUs:
    torchrun --nproc-per-node N -m gaca_cli score … (rank 0 merges).

    Example: gaca score rollouts.parquet --model Qwen/Qwen2.5-0.5B-Instruct -o scored.parquet
    """
    config = build_config(
        ScoreConfig, model=model, revision=revision, dtype=dtype, device=device,
        trust_remote_code=trust_remote_code, temperature=temperature, token_logprobs=token_logprobs,
        context=context, add_special_tokens=add_special_tokens, strict_prefix=strict_prefix, pack=pack,
        max_batch_tokens=max_batch_tokens, chunk_rows=chunk_rows, resume=resume,
    )
    out = output_path(logs, output, "scored")
    from gaca_cli.log.io import read_log
    from gaca_cli.lm.scoring import distributed_from_env, run_score

    console = err_console()
    with user_errors(), distributed_from_env() as (rank, world, barrier):
        log = read_log(logs, column_map(column_maps))
        with _progress_bar(console, enabled=rank == 0) as bar:
            result = run_score(log, config, out, rank=rank, world=world, barrier=barrier, progress=bar)
    if rank != 0:
        return
    if as_json:
        print_json(result.summary)
    else:
        console.print(_summary_text(result.summary), markup=False, highlight=False)


class _RichProgress:
    """rows, tokens/s and ETA on stderr; invisible when stderr is not a terminal."""

    def __init__(self, progress) -> None:
        self._progress = progress
        self._task = None
        self._tokens = 0

    def start(self, total_rows: int) -> None:
        self._task = self._progress.add_task("scoring", total=total_rows, tok_s="")

    def advance(self, rows: int, tokens: int) -> None:
        self._tokens += tokens
        task = self._progress.tasks[0]
        elapsed = task.elapsed or 0.0
        rate = f"{self._tokens / elapsed:,.0f} tok/s" if elapsed > 0 and self._tokens else ""
        self._progress.update(self._task, advance=rows, tok_s=rate)


class _progress_bar:
    def __init__(self, console, enabled: bool) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("rows"),
            TextColumn("{task.fields[tok_s]}"), TimeRemainingColumn(),
            console=console, transient=True, disable=not (enabled and console.is_terminal),
        )

    def __enter__(self) -> _RichProgress:
        self._progress.__enter__()
        return _RichProgress(self._progress)

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)


def _summary_text(s: dict) -> str:
    lines = [
        f"wrote {s['output']}: {s['rows']:,} rows, {s['action_tokens']:,} action tokens scored with "
        f"{s['model']} ({s['dtype']}, T={s['temperature']:g}) on {s['device']}",
        f"  {s['trajectories']:,} trajectories, {s['packed_trajectories']:,} packed into one forward; "
        f"{s['unique_sequences']:,} sequences ({s['duplicate_sequences']:,} duplicates skipped), "
        f"{s['tokens']:,} tokens in {s['forwards']:,} forwards",
        f"  {s['wall_s']:.1f} s" + (f", {s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s") else "")
        + (f"; resumed {s['resumed_chunks']} of {s['chunks']} chunks" if s["resumed_chunks"] else ""),
    ]
    if s["mean_nll_per_token"] is not None:
        lines.append(f"  mean NLL {s['mean_nll_per_token']:.4f} nats/token")
    if s["empty_actions"]:
        lines.append(f"  {s['empty_actions']:,} empty actions (nll_sum 0, nll_mean null)")
    if s["prefix_mismatch_rows"]:
        lines.append(
            f"  warning: {s['prefix_mismatch_rows']:,} rows where the context's tokens are not a prefix of "
            f"context + action's; their action was tokenised on its own (rows {', '.join(s['prefix_mismatch_examples'])})"
        )
    if s["oom_backoffs"]:
        lines.append(f"  {s['oom_backoffs']} out-of-memory back-offs (lower --max-batch-tokens to avoid them)")
    for key, count in s.get("warnings", {}).items():
        if count:
            lines.append(f"  warning: {count:,} {key.replace('_', ' ')}")
    return "\n".join(lines)

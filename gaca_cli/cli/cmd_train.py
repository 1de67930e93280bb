"""`gaca train-offline`: an offline policy update from a log annotated with advantages."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from gaca_cli.cli.app import app
from gaca_cli.cli.common import JsonOption, MapOption, build_config, column_map, err_console, print_json, user_errors
from gaca_cli.lm.scoring import CONTEXT_SOURCES
from gaca_cli.lm.train_config import AGGREGATIONS, BEHAVIOR_SOURCES, LOSSES, TrainConfig

_D = TrainConfig(model="-")


@app.command("train-offline")
def train_offline(
    logs: list[Path] = typer.Argument(..., metavar="ANNOTATED...", help="Log(s) with an advantage column (from `gaca advantages`)."),
    model: str = typer.Option(..., "--model", "-M", help="Starting model: a local directory or a hub id."),
    output: Path = typer.Option(..., "-o", "--output", metavar="OUT_DIR", help="Directory for the trained model, checkpoints and metrics.jsonl."),
    loss: str = typer.Option(_D.loss, "--loss", help=f"Objective: {' | '.join(LOSSES)}."),
    aggregation: str = typer.Option(_D.aggregation, "--aggregation", help=f"{' | '.join(AGGREGATIONS)}: mean over the step's tokens, or per sequence then over sequences."),
    clip_low: float = typer.Option(_D.clip_low, "--clip-low", help="ppo: ε_low, ratio clipped below at 1 − ε_low."),
    clip_high: float = typer.Option(_D.clip_high, "--clip-high", help="ppo: ε_high, ratio clipped above at 1 + ε_high."),
    is_cap: Optional[float] = typer.Option(None, "--is-cap", help="pg: truncate importance weights π/μ at this value (default: no weights)."),
    awr_temperature: float = typer.Option(_D.awr_temperature, "--awr-temperature", help="awr: τ in exp(A/τ)."),
    awr_max_weight: float = typer.Option(_D.awr_max_weight, "--awr-max-weight", help="awr: clip of exp(A/τ)."),
    bc_threshold: float = typer.Option(_D.bc_threshold, "--bc-threshold", help="filtered-bc: train on the steps with A above this."),
    kl_coef: float = typer.Option(_D.kl_coef, "--kl-coef", help="Weight of the k3 KL penalty to the starting model (0: off)."),
    behavior: str = typer.Option(_D.behavior, "--behavior", help=f"μ from: {' | '.join(BEHAVIOR_SOURCES)} (auto: the first that lines up with the action tokens)."),
    temperature: float = typer.Option(_D.temperature, "--temperature", "-T", help="Divide logits by T (as `gaca score -T`)."),
    context: str = typer.Option(_D.context, "--context", help=f"Context from: {' | '.join(CONTEXT_SOURCES)} (as `gaca score`)."),
    add_special_tokens: bool = typer.Option(_D.add_special_tokens, "--add-special-tokens", help="Let the tokenizer add BOS to a `prompt` (as `gaca score`)."),
    strict_prefix: bool = typer.Option(_D.strict_prefix, "--strict-prefix", help="Error where context tokens are not a prefix of context + action's."),
    lr: float = typer.Option(_D.lr, "--lr", help="Peak learning rate (after warm-up)."),
    weight_decay: float = typer.Option(_D.weight_decay, "--weight-decay", help="AdamW weight decay."),
    warmup_ratio: float = typer.Option(_D.warmup_ratio, "--warmup-ratio", help="Fraction of the steps spent warming up linearly."),
    min_lr_ratio: float = typer.Option(_D.min_lr_ratio, "--min-lr-ratio", help="Cosine decay floor, as a fraction of --lr."),
    max_grad_norm: float = typer.Option(_D.max_grad_norm, "--max-grad-norm", help="Clip the gradient norm (0: no clipping)."),
    batch_size: int = typer.Option(_D.batch_size, "--batch-size", help="Logged steps per optimiser step."),
    max_batch_tokens: int = typer.Option(_D.max_batch_tokens, "--max-batch-tokens", help="Padded tokens per micro-batch; gradients accumulate over a step's micro-batches."),
    epochs: int = typer.Option(_D.epochs, "--epochs", help="Passes over the steps (ignored with --max-steps)."),
    max_steps: Optional[int] = typer.Option(None, "--max-steps", help="Optimiser steps to take (overrides --epochs)."),
    max_length: Optional[int] = typer.Option(None, "--max-length", help="Skip steps longer than this many tokens (counted)."),
    seed: int = typer.Option(_D.seed, "--seed", help="Seed of data order and initialisation."),
    lora_r: int = typer.Option(_D.lora_r, "--lora-r", help="LoRA rank (0: full fine-tuning)."),
    lora_alpha: Optional[float] = typer.Option(None, "--lora-alpha", help="LoRA α (default 2·r)."),
    lora_targets: str = typer.Option(",".join(_D.lora_targets), "--lora-targets", help="Comma-separated module names, or all-linear."),
    merge: bool = typer.Option(_D.merge, "--merge", help="LoRA: save merged full weights in OUT_DIR (adapter in OUT_DIR/adapter)."),
    dtype: str = typer.Option(_D.dtype, "--dtype", help="auto | bf16 | fp32 (auto: bf16 autocast on CUDA, fp32 elsewhere)."),
    device: str = typer.Option(_D.device, "--device", help="auto (CUDA when present, else CPU) | cpu | cuda | cuda:N."),
    gradient_checkpointing: bool = typer.Option(_D.gradient_checkpointing, "--gradient-checkpointing", help="Recompute activations in backward (less memory)."),
    save_every: int = typer.Option(_D.save_every, "--save-every", help="Checkpoint every N optimiser steps (0: never)."),
    keep_checkpoints: int = typer.Option(_D.keep_checkpoints, "--keep-checkpoints", help="Checkpoints kept in OUT_DIR/checkpoints."),
    resume: bool = typer.Option(False, "--resume", help="Continue the run in OUT_DIR from its latest checkpoint."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of --model."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Run the model repository's own Python code."),
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
    config = build_config(
        TrainConfig, model=model, revision=revision, trust_remote_code=trust_remote_code, loss=loss,
        aggregation=aggregation, clip_low=clip_low, clip_high=clip_high, is_cap=is_cap,
        awr_temperature=awr_temperature, awr_max_weight=awr_max_weight, bc_threshold=bc_threshold,
        kl_coef=kl_coef, behavior=behavior, temperature=temperature, context=context,
        add_special_tokens=add_special_tokens, strict_prefix=strict_prefix, lr=lr, weight_decay=weight_decay,
        warmup_ratio=warmup_ratio, min_lr_ratio=min_lr_ratio, max_grad_norm=max_grad_norm, batch_size=batch_size,
        max_batch_tokens=max_batch_tokens, epochs=epochs, max_steps=max_steps, max_length=max_length, seed=seed,
        lora_r=lora_r, lora_alpha=lora_alpha, lora_targets=tuple(t.strip() for t in lora_targets.split(",") if t.strip()),
        merge=merge, dtype=dtype, device=device, gradient_checkpointing=gradient_checkpointing,
        save_every=save_every, keep_checkpoints=keep_checkpoints,
    )
    from gaca_cli.log.io import read_log, same_or_inside
    from gaca_cli.lm.training import check_out_dir, train

    try:
        check_out_dir(output, resume)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="-o") from None
    if same_or_inside(output, logs) is not None:
        raise typer.BadParameter(f"{output} would fall inside the input {same_or_inside(output, logs)}", param_hint="-o")
    console = err_console()
    with user_errors():
        log = read_log(logs, column_map(column_maps))
        with _ProgressBar(console, enabled=os.environ.get("RANK", "0") == "0") as bar:
            try:
                result = train(log, config, output, resume=resume, on_event=bar.on_event)
            except KeyboardInterrupt:
                bar.stop()
                console.print(f"interrupted; continue with the same command and --resume ({output})")
                raise typer.Exit(130) from None
    if not result.is_main_process:
        return
    if as_json:
        print_json(result.summary)
    else:
        console.print(_summary_text(result.summary), markup=False, highlight=False)


class _ProgressBar:
    """Optimiser steps, loss, KL, clip fraction, tokens/s and ETA on stderr (terminal only)."""

    def __init__(self, console, enabled: bool = True) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeRemainingColumn(),
            console=console, transient=True, disable=not (enabled and console.is_terminal),
        )
        self._task = None

    def __enter__(self) -> _ProgressBar:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def stop(self) -> None:
        self._progress.stop()

    def on_event(self, kind: str, info: dict) -> None:
        if kind == "reference":
            if self._task is None:
                self._task = self._progress.add_task("reference log-probs", total=info["total"], info="")
            self._progress.update(self._task, completed=info["done"])
        elif kind == "start":
            if self._task is not None:
                self._progress.remove_task(self._task)
            self._task = self._progress.add_task("training", total=info["total_steps"], completed=info["start_step"], info="")
        elif kind == "step" and self._task is not None:
            parts = [f"loss {info['loss']:.4f}"] if info.get("loss") is not None else []
            for key, label in (("kl", "kl"), ("clip_frac", "clip"), ("ratio_max", "r_max")):
                if info.get(key) is not None:
                    parts.append(f"{label} {info[key]:.3g}")
            if info.get("tokens_per_s"):
                parts.append(f"{info['tokens_per_s']:,.0f} tok/s")
            self._progress.update(self._task, completed=info["step"], info="  ".join(parts))


def _fmt(x) -> str:
    return "–" if x is None else f"{x:.4g}"


def _summary_text(s: dict) -> str:
    rows = s["rows"]
    final = s["final"]
    lines = [
        f"wrote {s['output']}: {s['mode']} fine-tuning with --loss {s['loss']}, {s['steps']} optimiser steps "
        f"over {s['sequences']:,} steps of the log" + (f" (resumed at step {s['resumed_from_step']})" if s.get("resumed_from_step") else ""),
        f"  rows: {rows['rows']:,} read, {rows['trained']:,} trained on, {rows['no_gradient']:,} carry no gradient"
        + (f", {rows['empty_action']:,} empty actions" if rows.get("empty_action") else "")
        + (f", {rows['too_long']:,} longer than --max-length" if rows.get("too_long") else ""),
        f"  behavior log-probs: {s['behavior_source'] or 'none'}",
        f"  final step: loss {_fmt(final['loss'])}, policy loss {_fmt(final['policy_loss'])}, KL {_fmt(final['kl'])}, "
        f"ratio mean {_fmt(final['ratio_mean'])}, clip fraction {_fmt(final['clip_frac'])}, grad norm {_fmt(final['grad_norm'])}",
        f"  {s['tokens']:,} tokens in {s['wall_s']:.1f} s" + (f" ({s['tokens_per_s']:,.0f} tokens/s)" if s.get("tokens_per_s") else "")
        + f" on {s['processes']} process(es), {s['device']}, mixed precision {s['mixed_precision']}",
        f"  metrics: {Path(s['output']) / 'metrics.jsonl'}",
    ]
    if rows.get("prefix_mismatch"):
        lines.append(f"  warning: {rows['prefix_mismatch']:,} rows whose context tokens are not a prefix of context + action's "
                     "(their action was tokenised on its own, as `gaca score` does)")
    for key, count in s.get("warnings", {}).items():
        if count:
            lines.append(f"  warning: {count:,} {key.replace('_', ' ')}")
    return "\n".join(lines)

"""The output directory of `gaca train-offline`, its checkpoints and `--resume`: which runs an
output directory may hold, the newest complete checkpoint, what a resumed run must share with
the one it continues, and the metrics lines kept when it does."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

from gaca_cli.config import inactive_because
from gaca_cli.errors import GacaError
from gaca_cli.lm.train_config import TrainConfig

METRICS_FILE = "metrics.jsonl"

CHECKPOINTS_DIR = "checkpoints"

RUN_FILE = "gaca-train.json"  # written last: its presence means the run finished

STATE_FILE = "trainer_state.json"  # inside a checkpoint, written last: marks it complete

#: in CHECKPOINTS_DIR: what a run started with (options, data and model fingerprints), so that
#: --resume refuses other ones even before the first checkpoint
START_FILE = "started.json"

#: fields that may change between an interrupted run and its `--resume`
_RESUME_MAY_CHANGE = ("save_every", "keep_checkpoints")


def describe_out_dir(out_dir: Path) -> str:
    """`missing`, `empty`, `run` (holds a run: checkpoints or metrics) or `other` (files)."""
    if not out_dir.exists():
        return "missing"
    if not out_dir.is_dir():
        return "other"
    names = set(os.listdir(out_dir))
    if not names:
        return "empty"
    if names & {CHECKPOINTS_DIR, METRICS_FILE, RUN_FILE}:
        return "run"
    return "other"


def check_out_dir(out_dir: Path, resume: bool) -> None:
    """Refuse to mix runs: without --resume OUT_DIR must be new or empty; with --resume it may
    also hold a run (a new or empty OUT_DIR starts one: nothing to continue). Raises ValueError."""
    state = describe_out_dir(out_dir)
    if resume:
        if state == "other":
            raise ValueError(f"--resume: {out_dir} holds files but no training run to continue; choose another -o")
        return
    if state == "run":
        raise ValueError(f"{out_dir} already holds a training run; add --resume to continue it, or choose another -o")
    if state == "other":
        raise ValueError(f"{out_dir} exists and is not an empty directory; choose another -o")


def _complete_checkpoints(out_dir: Path) -> list[Path]:
    """The complete checkpoints (their trainer_state.json is written last), oldest first."""
    root = out_dir / CHECKPOINTS_DIR
    paths = root.iterdir() if root.is_dir() else ()
    return sorted(p for p in paths if p.name.startswith("step-") and (p / STATE_FILE).exists())


def latest_checkpoint(out_dir: Path) -> Path | None:
    complete = _complete_checkpoints(out_dir)
    return complete[-1] if complete else None


def prune_checkpoints(out_dir: Path, keep: int) -> None:
    for old in _complete_checkpoints(out_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    remove_partial_checkpoints(out_dir)


def remove_partial_checkpoints(out_dir: Path) -> None:
    """Remove the checkpoints a run was killed while saving (`step-N.tmp`: a complete one is
    renamed to `step-N`): after each save, and when a run is resumed."""
    root = out_dir / CHECKPOINTS_DIR
    if not root.is_dir():
        return
    for partial in root.iterdir():
        if partial.name.startswith("step-") and partial.name.endswith(".tmp"):
            shutil.rmtree(partial, ignore_errors=True)


def resume_fields(config: TrainConfig) -> dict:
    from gaca_cli.lm.models import model_key

    meta = config.as_metadata() | {"model": model_key(config.model)}
    for name in _RESUME_MAY_CHANGE:
        meta.pop(name, None)
    for f in fields(config):  # an option that does nothing here (--clip-high with --loss pg) is not compared
        if f.name in meta and inactive_because(config, f.name) is not None:
            meta.pop(f.name)
    return meta


def _device_kind(device: Any) -> str | None:
    """What a `--device` value trains on here: cpu or cuda (None for anything else)."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu" or (isinstance(device, str) and device.startswith("cuda")):
        return "cpu" if device == "cpu" else "cuda"
    return None


def check_resumable(
    state: dict, config: TrainConfig, fingerprint: str, model_fingerprint: str, checkpoint: Path
) -> None:
    then = state.get("config", {})
    now = resume_fields(config)
    for name, value in now.items():
        if name == "device" and _device_kind(value) is not None and _device_kind(then.get(name)) == _device_kind(value):
            continue  # the same kind of device under another name (auto = cpu without a GPU; cuda:N = cuda)
        if then.get(name) != value:
            raise GacaError(
                f"--resume: the run was started with {name} = {then.get(name)!r}, now {value!r}; "
                "resume with the same options, or start a new run in another -o",
                file=str(checkpoint),
            )
    if state.get("data_fingerprint") != fingerprint:
        raise GacaError(
            "--resume: the training data differ from those the run started with (other log, "
            "advantages or tokenizer); resume with the same log, or start a new run in another -o",
            file=str(checkpoint),
        )
    if state.get("model_fingerprint") != model_fingerprint:
        raise GacaError(
            f"--resume: the starting model {config.model} is not the one the run started from (its files "
            "changed); resume with the same model, or start a new run in another -o",
            file=str(checkpoint),
        )


def truncate_metrics(path: Path, last_step: int) -> None:
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line).get("step", 0) <= last_step:
                kept.append(line)
        except json.JSONDecodeError:
            break  # a line cut by the interruption
    tmp = path.with_name(path.name + ".tmp")  # replaced at once: a kill keeps the old lines
    tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
    os.replace(tmp, path)


def finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

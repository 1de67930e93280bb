"""`gaca train-offline` as a library call: an offline policy update from an annotated log.

The pipeline, in order (nothing is written before step 4, so a bad log or model leaves no
output behind):

1. check the log (`prepare_log(log, "train-offline")`) and the `advantage` column;
2. load the starting model and tokenizer (`models.load_causal_lm`) and tokenise every step
   into context and action tokens exactly as `gaca score` does, so that `token_logprobs`
   written by `gaca score --token-logprobs` line up with the trained tokens;
3. pick the behavior log-probs μ (`behavior_logprobs` or `token_logprobs`) and drop the steps
   that carry no gradient (A = 0 for ppo/pg, A ≤ threshold for filtered-bc, empty actions);
4. train: AdamW, linear warm-up then cosine decay, optimiser steps of `batch_size` logged steps
   split into token-budget micro-batches whose gradients accumulate, gradient clipping,
   checkpoints every `save_every` steps, one metrics line per optimiser step;
5. save a model that transformers loads (full weights, or a LoRA adapter, or merged weights).

Objectives live in `losses.py`. Data parallelism comes from accelerate: every process builds
the same batches (the order is a pure function of seed, epoch and step) and takes its share
of each optimiser step; token weights are normalised by the whole step's counts, so one
process and N processes compute the same update.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gaca_cli import __version__
from gaca_cli.errors import GacaError
from gaca_cli.files import missing_dirs, remove_empty
from gaca_cli.lm.checkpoints import (
    CHECKPOINTS_DIR,
    METRICS_FILE,
    RUN_FILE,
    START_FILE,
    STATE_FILE,
    check_resumable,
    finite_or_none,
    latest_checkpoint,
    prune_checkpoints,
    remove_partial_checkpoints,
    resume_fields,
    truncate_metrics,
)
from gaca_cli.lm.policy import action_logprobs, apply_lora, disable_dropout, logits_keep_mode
from gaca_cli.lm.train_config import TrainConfig
from gaca_cli.lm.train_data import build_train_data, read_advantages
from gaca_cli.log import columns as C
from gaca_cli.log.checks import prepare_log
from gaca_cli.log.reading import Log

# --------------------------------------------------------------------------------------------
# schedule and batches: pure functions of (config, step)


def total_steps(n_sequences: int, config: TrainConfig) -> int:
    """`max_steps` if given, else epochs × ⌈S / batch_size⌉."""
    if config.max_steps is not None:
        return config.max_steps
    return config.epochs * math.ceil(n_sequences / config.batch_size)


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak lr used by optimiser step `step` (0-based) out of `total`:

        step < W:   (step + 1) / W                                   (linear warm-up)
        else:       m + (1 − m) · ½ · (1 + cos(π · (step − W) / (total − W)))

    with W = warmup steps and m = min_ratio. The first step already moves (lr·1/W) and the last
    step's lr stays above m·lr. Example: total = 10, W = 2, m = 0: 0.5, 1, 1, 0.962, 0.854, …
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_steps(total: int, config: TrainConfig) -> int:
    return int(round(config.warmup_ratio * total))


class BatchPlan:
    """Which sequences make optimiser step k: epoch e = k // steps_per_epoch, a permutation of
    the sequences drawn from numpy's default_rng([seed, e]), cut into `batch_size` slices (the
    last one of an epoch may be shorter). A pure function of (seed, step): `--resume` needs no
    sampler state."""

    def __init__(self, n_sequences: int, batch_size: int, seed: int) -> None:
        self.n = n_sequences
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = math.ceil(n_sequences / batch_size)
        self._cache: tuple[int, np.ndarray] | None = None

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def batch(self, step: int) -> np.ndarray:
        epoch = self.epoch_of(step)
        if self._cache is None or self._cache[0] != epoch:
            self._cache = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.n))
        k = step % self.steps_per_epoch
        return self._cache[1][k * self.batch_size : (k + 1) * self.batch_size]


def micro_batches(lengths: np.ndarray, max_batch_tokens: int, rank: int = 0, world: int = 1) -> list[np.ndarray]:
    """Split one optimiser step's sequences (given by their lengths) into micro-batches.

    Sequences are sorted by length (longest first) and dealt round-robin to the `world`
    processes; each process packs its share greedily so that (sequences × longest length)
    ≤ `max_batch_tokens` (a single longer sequence forms its own micro-batch). Returns
    positions into `lengths`; an empty list when this process gets no sequence.
    """
    order = np.argsort(-lengths, kind="stable")[rank::world]
    out: list[np.ndarray] = []
    current: list[int] = []
    longest = 0
    for pos in order:
        length = int(lengths[pos])
        if current and (len(current) + 1) * max(longest, length) > max_batch_tokens:
            out.append(np.asarray(current, dtype=np.int64))
            current, longest = [], 0
        current.append(int(pos))
        longest = max(longest, length)
    if current:
        out.append(np.asarray(current, dtype=np.int64))
    return out


# --------------------------------------------------------------------------------------------
# the run


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    summary: dict
    metrics: list[dict]  # this run's metrics lines (from the resumed step on)
    is_main_process: bool = True


EventHandler = Callable[[str, dict], None]


#: what each optimiser step adds up over its micro-batches (and over the processes)
_SUMS = ("policy", "kl", "tokens", "action_tokens", "ratio_sum", "ratio_sq", "ratio_n", "clipped", "seqs")


def train_device(device: str):
    """`--device` of train-offline as a torch device: `auto` is CUDA when there is a GPU, else
    the CPU; `cuda` and `cuda:N` raise a GacaError when there is no such GPU. Under a launcher
    (torchrun, accelerate launch) each process trains on its own GPU, so `cuda:N` is refused
    there; in one process `cuda:N` becomes the current CUDA device, which accelerate uses."""
    import torch

    from gaca_cli.lm.models import resolve_device

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    launched = "LOCAL_RANK" in os.environ
    if device.startswith("cuda:") and launched:
        raise GacaError(
            f"--device {device}: under torchrun / accelerate launch each process trains on its own GPU; "
            "use --device cuda or auto"
        )
    dev = resolve_device(device)
    if dev.type == "cuda" and dev.index is not None and not launched:
        torch.cuda.set_device(dev)
    return dev


def fresh_accelerator_state() -> None:
    """Let this run choose its own device and precision. accelerate keeps one state per process
    and refuses an `Accelerator` that asks for another device or mixed precision than the
    process's first one did ("AcceleratorState has already been initialized"), and a process
    that first ran on the CPU would keep the CPU. A second run in one process (a notebook, the
    tests) may ask for either, so the run resets that state; the process-level part is kept
    when a launcher (torchrun, accelerate launch) has set up a process group, which one run
    per process never changes. accelerate has no public reset: its `_reset_state` is used."""
    import torch.distributed as dist
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=not (dist.is_available() and dist.is_initialized()))


class _Trainer:
    """One training run: holds the accelerator, model, optimiser and data (internal)."""

    def __init__(self, log: Log, config: TrainConfig, out_dir: Path, resume: bool, on_event: EventHandler | None):
        self.log = log
        self.config = config
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.emit = on_event or (lambda kind, info: None)

    # ---- setup (no side effects on disk) ----
    def setup(self) -> None:
        from accelerate import Accelerator
        from accelerate.utils import set_seed

        from gaca_cli.lm.models import is_adapter, load_causal_lm, model_fingerprint, position_limit

        config = self.config
        self.index, self.warnings = prepare_log(self.log, "train-offline")
        read_advantages(self.log, self.index)  # fail on a bad advantage column before loading a model
        if config.use_lora and is_adapter(config.model):
            raise GacaError(
                "is a LoRA adapter, and a new adapter on top of it would name the adapter's base model "
                "as its own and lose this one: train it in full (--lora-r 0), or start from merged "
                "weights (train-offline --merge writes them)",
                file=config.model,
            )
        use_cpu = train_device(config.device).type == "cpu"
        bf16 = config.dtype == "bf16" or (config.dtype == "auto" and not use_cpu)
        fresh_accelerator_state()
        self.accelerator = Accelerator(cpu=use_cpu, mixed_precision="bf16" if bf16 else "no")
        set_seed(config.seed)
        model_id = str(Path(config.model).resolve()) if os.path.isdir(config.model) else config.model
        model, tokenizer, device, _ = load_causal_lm(
            model_id,
            revision=config.revision,
            dtype="fp32",
            device=str(self.accelerator.device),
            trust_remote_code=config.trust_remote_code,
        )
        self.device = device
        self.tokenizer = tokenizer
        vocab = model.get_input_embeddings().num_embeddings
        self.data = build_train_data(
            self.log, self.index, tokenizer, config, vocab_size=vocab, position_limit=position_limit(model)
        )
        self.fingerprint = self.data.fingerprint()
        self.model_fingerprint = model_fingerprint(model_id, config.revision)
        self.pad_id = next((t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None), 0)
        self.total = total_steps(len(self.data), config)
        self.warmup = warmup_steps(self.total, config)
        self.plan = BatchPlan(len(self.data), config.batch_size, config.seed)
        self.checkpoint = None
        self.start_step = 0
        if self.resume:
            self.checkpoint = latest_checkpoint(self.out_dir)
            started = self.out_dir / CHECKPOINTS_DIR / START_FILE
            if self.checkpoint is not None:
                state = json.loads((self.checkpoint / STATE_FILE).read_text(encoding="utf-8"))
                check_resumable(state, config, self.fingerprint, self.model_fingerprint, self.checkpoint)
                self.start_step = int(state["step"])
            elif started.exists():  # killed before its first checkpoint: it starts again, if the same run
                state = json.loads(started.read_text(encoding="utf-8"))
                check_resumable(state, config, self.fingerprint, self.model_fingerprint, started)
        self.model = model

    # ---- reference log-probs for the KL penalty ----
    def reference_logprobs(self) -> list[np.ndarray]:
        """log π_ref of every action token under the starting model, computed once (no grad)."""
        import torch

        data = self.data
        lengths = data.lengths
        out: list[np.ndarray | None] = [None] * len(data)
        groups = micro_batches(lengths, self.config.max_batch_tokens)
        self.model.eval()
        done = 0
        with torch.no_grad():
            for group in groups:
                flat = self._action_logprobs(group).float().cpu().numpy()
                start = 0
                for i in group:
                    n = int(lengths[i] - data.n_context[i])
                    out[i] = flat[start : start + n]
                    start += n
                done += len(group)
                self.emit("reference", {"done": done, "total": len(data)})
        return out  # type: ignore[return-value]

    def _action_logprobs(self, sequences: np.ndarray):
        """log π_θ of the action tokens of the given sequences, one flat tensor (under autocast)."""
        data = self.data
        with self.accelerator.autocast():
            return action_logprobs(
                self.model,
                [data.input_ids[i] for i in sequences],
                [int(data.n_context[i]) for i in sequences],
                self.pad_id,
                self.device,
                self.config.temperature,
                self.keep_mode,
            )

    # ---- build the trainable model, optimiser and scheduler ----
    def prepare(self) -> None:
        import torch

        config = self.config
        self.keep_mode = logits_keep_mode(self.model)
        self.ref = self.reference_logprobs() if config.kl_coef > 0 else None
        model = self.model
        if config.use_lora:
            model = apply_lora(model, config)
        disable_dropout(model)
        if config.gradient_checkpointing:
            kwargs = {"use_reentrant": False}
            if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x: the other name is deprecated
                model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=config.weight_decay
        )
        total, warmup, floor = self.total, self.warmup, config.min_lr_ratio
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, warmup, floor))
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.scheduler = scheduler
        self.accelerator.register_for_checkpointing(scheduler)
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    # ---- one optimiser step ----
    def step(self, step: int) -> dict:
        import torch

        from gaca_cli.lm.losses import kl_k3, policy_token_loss, token_weights

        acc, config, data = self.accelerator, self.config, self.data
        started = time.perf_counter()
        batch = self.plan.batch(step)
        lengths = data.lengths[batch]
        n_action = lengths - data.n_context[batch]
        n_tok_total, n_seq_total = float(n_action.sum()), float(len(batch))
        world = acc.num_processes
        groups = micro_batches(lengths, config.max_batch_tokens, acc.process_index, world)
        dummy = not groups  # this process got no sequence: a zero-weight pass keeps DDP in step
        if dummy:
            groups = [np.asarray([0], dtype=np.int64)]
        sums = dict.fromkeys(_SUMS, 0.0)
        ratio_max = torch.tensor(0.0, device=self.device)
        lr = self.scheduler.get_last_lr()[0]
        for j, group in enumerate(groups):
            members = batch[group]
            sync = acc.no_sync(self.model) if j < len(groups) - 1 else nullcontext()
            with sync:
                logp = self._action_logprobs(members)
                act = n_action[group]
                seq_of_token = torch.from_numpy(np.repeat(np.arange(len(members)), act)).to(self.device)
                adv = torch.from_numpy(np.repeat(data.advantage[members], act)).to(self.device)
                behavior = None
                if data.behavior is not None:
                    behavior = torch.from_numpy(np.concatenate([data.behavior[i] for i in members])).to(self.device)
                ell, stats = policy_token_loss(config.loss, logp, adv, behavior, config)
                weight = token_weights(
                    seq_of_token, torch.from_numpy(act).to(self.device), config.aggregation, n_tok_total, n_seq_total
                )
                if dummy:
                    weight = weight * 0.0
                policy = (weight * ell).sum()
                loss = policy
                if self.ref is not None:
                    if step == 0:  # π_θ is π_ref before any update: δ = 0 exactly, whatever the micro-batch
                        ref = logp.detach()  # (the precomputed π_ref, from other shapes, differs by ~1e-7)
                    else:
                        ref = torch.from_numpy(np.concatenate([self.ref[i] for i in members])).to(self.device)
                    kl = kl_k3(logp, ref)
                    weighted_kl = (weight * kl).sum()  # aggregated as the policy loss is (token- or seq-mean)
                    loss = loss + config.kl_coef * weighted_kl
                    sums["kl"] += 0.0 if dummy else float(weighted_kl.detach())
                acc.backward(loss * world)  # DDP averages over processes; weights already use global counts
            if dummy:
                continue
            sums["policy"] += float(policy.detach())
            sums["tokens"] += float(lengths[group].sum())
            sums["action_tokens"] += float(act.sum())
            sums["seqs"] += float(len(members))
            if "ratio" in stats:
                r = stats["ratio"]
                sums["ratio_sum"] += float(r.sum())
                sums["ratio_sq"] += float((r * r).sum())
                sums["ratio_n"] += float(r.numel())
                ratio_max = torch.maximum(ratio_max, r.max())
            if "clipped" in stats:
                sums["clipped"] += float(stats["clipped"].sum())
        max_norm = config.max_grad_norm if config.max_grad_norm > 0 else float("inf")
        grad_norm = acc.clip_grad_norm_(self.params, max_norm)
        if not math.isfinite(float(grad_norm)):  # the same on every process: DDP averaged the gradients
            raise GacaError(
                f"training diverged at step {step + 1}: the gradient is {float(grad_norm)} (a NaN or "
                "infinite loss); no model is saved"
                + (f" ({METRICS_FILE} holds the steps before, and any checkpoint of them is kept)" if step else "")
                + f"; {self._divergence_advice(step)}",
                file=str(self.out_dir),
            )
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        keys = list(sums)
        totals = torch.tensor([sums[k] for k in keys], dtype=torch.float64, device=self.device)
        if world > 1:
            totals = acc.reduce(totals, reduction="sum")
            ratio_max = acc.reduce(ratio_max, reduction="max")
        t = dict(zip(keys, totals.tolist()))
        elapsed = time.perf_counter() - started
        has_ratio = t["ratio_n"] > 0
        kl_mean = t["kl"] if self.ref is not None else float("nan")  # the weights sum to 1 over the step
        return {
            "step": step + 1,
            "epoch": self.plan.epoch_of(step),
            "loss": t["policy"] + (config.kl_coef * kl_mean if self.ref is not None else 0.0),
            "policy_loss": t["policy"],
            "kl": kl_mean,
            "ratio_mean": t["ratio_sum"] / t["ratio_n"] if has_ratio else float("nan"),
            "ratio_max": float(ratio_max) if has_ratio else float("nan"),
            "clip_frac": t["clipped"] / t["action_tokens"] if config.loss == "ppo" else float("nan"),
            "ess": (t["ratio_sum"] ** 2) / (t["ratio_n"] * t["ratio_sq"])
            if has_ratio and t["ratio_sq"] > 0
            else float("nan"),
            "grad_norm": float(grad_norm),
            "lr": lr,
            "seqs": int(t["seqs"]),
            "tokens": int(t["tokens"]),
            "action_tokens": int(t["action_tokens"]),
            "tokens_per_s": t["tokens"] / elapsed if elapsed > 0 else float("nan"),
            "step_s": elapsed,
        }

    # ---- checkpoints and outputs ----
    def state(self, step: int) -> dict:
        """What a checkpoint (and START_FILE) records for --resume to check and continue."""
        return {
            "step": step,
            "config": resume_fields(self.config),
            "data_fingerprint": self.fingerprint,
            "model_fingerprint": self.model_fingerprint,
            "gaca_version": __version__,
        }

    def save_checkpoint(self, step: int) -> None:
        acc = self.accelerator
        root = self.out_dir / CHECKPOINTS_DIR
        final = root / f"step-{step:08d}"
        tmp = root / f"step-{step:08d}.tmp"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True, exist_ok=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp))
        acc.wait_for_everyone()
        if acc.is_main_process:
            (tmp / STATE_FILE).write_text(json.dumps(self.state(step), indent=2, default=str), encoding="utf-8")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            prune_checkpoints(self.out_dir, self.config.keep_checkpoints)
        acc.wait_for_everyone()

    def restore(self) -> None:
        if not self.resume:
            return
        if self.checkpoint is not None:
            self.accelerator.load_state(str(self.checkpoint))
        if self.accelerator.is_main_process:
            truncate_metrics(self.out_dir / METRICS_FILE, self.start_step)
            remove_partial_checkpoints(self.out_dir)

    def record_start(self) -> None:
        """Write START_FILE (main process), atomically, once the checks have passed."""
        started = self.out_dir / CHECKPOINTS_DIR / START_FILE
        if not self.accelerator.is_main_process or started.exists():
            return
        started.parent.mkdir(parents=True, exist_ok=True)
        tmp = started.with_name(started.name + ".tmp")
        tmp.write_text(json.dumps(self.state(0), indent=2, default=str), encoding="utf-8")
        os.replace(tmp, started)

    def save_final(self) -> dict:
        acc = self.accelerator
        acc.wait_for_everyone()
        unwrapped = acc.unwrap_model(self.model)
        out = self.out_dir
        saved: dict[str, str] = {}
        if self.config.use_lora:
            if acc.is_main_process:
                unwrapped.save_pretrained(out / "adapter" if self.config.merge else out)
            saved["adapter"] = str(out / "adapter" if self.config.merge else out)
            if self.config.merge:
                merged = unwrapped.merge_and_unload()
                if acc.is_main_process:
                    merged.save_pretrained(out, safe_serialization=True)
                saved["model"] = str(out)
        else:
            state_dict = acc.get_state_dict(self.model)
            if acc.is_main_process:
                unwrapped.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
            saved["model"] = str(out)
        if acc.is_main_process:
            self.tokenizer.save_pretrained(out)
        acc.wait_for_everyone()
        return saved

    # ---- the whole run ----
    def run(self) -> TrainResult:
        self.setup()
        self.prepare()
        if (finished := self.finished_run()) is not None:
            return finished
        acc = self.accelerator
        # every check has passed: from here on the output directory may be written
        created = missing_dirs(self.out_dir)
        if acc.is_main_process:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        acc.wait_for_everyone()
        self.restore()
        self.record_start()
        try:
            return self._train()
        except GacaError:
            # a data or model problem (a diverged first step, say) before anything worth keeping:
            # what this run wrote goes, so that the fixed command runs without --resume
            if acc.is_main_process and self.start_step == 0 and latest_checkpoint(self.out_dir) is None:
                if not (self.out_dir / METRICS_FILE).exists():
                    (self.out_dir / CHECKPOINTS_DIR / START_FILE).unlink(missing_ok=True)
                    remove_empty([self.out_dir / CHECKPOINTS_DIR, *created])
            raise

    def finished_run(self) -> TrainResult | None:
        """With --resume, a run that already finished (RUN_FILE, which records how it started):
        checked like a checkpoint, then its result as it was written, with nothing trained
        again (a job scheduler that passes --resume to a finished job gets the same model);
        None otherwise."""
        path = self.out_dir / RUN_FILE
        if not self.resume or not path.exists():
            return None
        doc = json.loads(path.read_text(encoding="utf-8")).get(C.META_TRAIN, {})
        if "state" not in doc:  # written before runs recorded their state: trained again, as then
            return None
        check_resumable(doc["state"], self.config, self.fingerprint, self.model_fingerprint, path)
        metrics_path = self.out_dir / METRICS_FILE
        lines = metrics_path.read_text(encoding="utf-8").splitlines() if metrics_path.exists() else []
        summary = {**doc["summary"], "already_finished": True}
        return TrainResult(
            out_dir=self.out_dir,
            summary=summary,
            metrics=[json.loads(line) for line in lines if line.strip()],
            is_main_process=self.accelerator.is_main_process,
        )

    def _divergence_advice(self, step: int) -> str:
        """What to change when the gradient is not finite at optimiser step `step`."""
        if step == 0:  # no update yet: the starting model and the data give it
            largest = float(np.max(np.abs(self.data.advantage), initial=0.0))
            suspects = [f"the advantage column (its largest |A| is {largest:.3g})"] if largest > 1e4 else []
            if self.config.temperature != 1.0:
                suspects.append(f"-T {self.config.temperature:g}")
            if not suspects:  # ordinary advantages, T = 1: the model
                suspects.append("the starting model (`gaca score` with it names steps whose NLL is not finite)")
            return f"the loss is not finite before any update: check {' and '.join(suspects)}"
        return "lower --lr" if self.config.max_grad_norm > 0 else "lower --lr, or set --max-grad-norm"

    def _train(self) -> TrainResult:
        acc = self.accelerator
        metrics_path = self.out_dir / METRICS_FILE
        start = {"total_steps": self.total, "start_step": self.start_step, "sequences": len(self.data)}
        self.emit("start", {**start, "behavior_source": self.data.behavior_source})
        history: list[dict] = []
        wall = time.perf_counter()
        for step in range(self.start_step, self.total):
            record = {k: finite_or_none(v) for k, v in self.step(step).items()}
            history.append(record)
            if acc.is_main_process:
                with metrics_path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(record) + "\n")
            if self.config.save_every and (step + 1) % self.config.save_every == 0 and step + 1 < self.total:
                self.save_checkpoint(step + 1)
            self.emit("step", record)
        wall = time.perf_counter() - wall
        saved = self.save_final()
        summary = self.summary(history, wall, saved)
        if acc.is_main_process:
            run_doc = {
                C.META_TRAIN: {
                    "config": self.config.as_metadata(),
                    "summary": summary,
                    "data_fingerprint": self.fingerprint,
                    "gaca_version": __version__,
                    "state": self.state(self.total),  # what --resume checks on a finished run
                }
            }
            (self.out_dir / RUN_FILE).write_text(json.dumps(run_doc, indent=2, default=str), encoding="utf-8")
        return TrainResult(out_dir=self.out_dir, summary=summary, metrics=history, is_main_process=acc.is_main_process)

    def summary(self, history: list[dict], wall: float, saved: dict) -> dict:
        tokens = sum(h["tokens"] for h in history)
        last = history[-1] if history else {}
        return {
            "output": str(self.out_dir),
            "loss": self.config.loss,
            "mode": f"lora r={self.config.lora_r}" + (" merged" if self.config.merge else "")
            if self.config.use_lora
            else "full",
            "behavior_source": self.data.behavior_source,
            "steps": self.total,
            "resumed_from_step": self.start_step if self.resume else None,
            "sequences": len(self.data),
            "rows": self.data.counts,
            "warnings": self.warnings,
            "final": {k: last.get(k) for k in ("loss", "policy_loss", "kl", "ratio_mean", "clip_frac", "grad_norm")},
            "tokens": tokens,
            "tokens_per_s": finite_or_none(tokens / wall) if wall > 0 and tokens else None,
            "wall_s": round(wall, 3),
            "processes": self.accelerator.num_processes,
            "device": str(self.device),
            "mixed_precision": str(self.accelerator.mixed_precision),
            **saved,
        }


def train(
    log: Log,
    config: TrainConfig,
    out_dir: str | os.PathLike,
    *,
    resume: bool = False,
    on_event: EventHandler | None = None,
) -> TrainResult:
    """Run `gaca train-offline`. Raises GacaError for bad logs or models before anything is
    written; `on_event(kind, info)` receives "reference", "start" and "step" events (the
    metrics line of each optimiser step), e.g. to draw a progress bar."""
    return _Trainer(log, config, Path(out_dir), resume, on_event).run()

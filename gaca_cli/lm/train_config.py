"""The configuration of `gaca train-offline`: its choices and one frozen dataclass whose fields
carry each option's default, help text and (in `__post_init__`) validation.

Kept apart from `gaca_cli.lm.training` (pyarrow, the log checks, torch on use) so that the
command line builds its options from these fields without importing any of that.
"""

from __future__ import annotations

import math
import re
import typing
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Literal

from gaca_cli.config import check_choices, invalid
from gaca_cli.lm.score_config import ContextSource

if TYPE_CHECKING:
    import numpy as np

Loss = Literal["ppo", "pg", "awr", "filtered-bc"]
LOSSES: tuple[Loss, ...] = typing.get_args(Loss)  # the keys of losses.TOKEN_LOSSES (a test checks it)


@dataclass(frozen=True)
class TrainConfig:
    """Every parameter of `gaca train-offline`, with its default and help text."""

    model: str = field(metadata={"help": "Starting model: a local directory, a GGUF file or a hub id.", "short": "-M"})
    revision: str | None = field(default=None, metadata={"help": "Hub revision of --model."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Run the model repository's own Python code."})
    # objective
    loss: Loss = field(default="ppo", metadata={"help": "The loss per action token."})
    aggregation: Literal["token-mean", "seq-mean"] = field(
        default="token-mean", metadata={"help": "Mean over the step's tokens, or per sequence then over sequences."}
    )
    clip_low: float = field(
        default=0.2, metadata={"only": ("loss", ("ppo",)), "help": "ppo: ε_low, ratio clipped below at 1 − ε_low."}
    )
    clip_high: float = field(
        default=0.2, metadata={"only": ("loss", ("ppo",)), "help": "ppo: ε_high, ratio clipped above at 1 + ε_high."}
    )
    is_cap: float | None = field(
        default=None, metadata={"help": "pg: truncate importance weights π/μ at this value (default: no weights)."}
    )
    awr_temperature: float = field(default=1.0, metadata={"only": ("loss", ("awr",)), "help": "awr: τ in exp(A/τ)."})
    awr_max_weight: float = field(default=20.0, metadata={"only": ("loss", ("awr",)), "help": "awr: clip of exp(A/τ)."})
    bc_threshold: float = field(
        default=0.0,
        metadata={"only": ("loss", ("filtered-bc",)), "help": "filtered-bc: train on the steps with A above this."},
    )
    kl_coef: float = field(
        default=0.0, metadata={"help": "Weight of the k3 KL penalty to the starting model (0: off)."}
    )
    behavior: Literal["auto", "behavior_logprobs", "token_logprobs"] = field(  # auto or a column's name
        default="auto",
        metadata={"help": "The column μ is read from (auto: the first that lines up with the action tokens)."},
    )
    temperature: float = field(
        default=1.0, metadata={"help": "Divide logits by T (as `gaca score -T`).", "short": "-T"}
    )
    # tokenisation (the same options as `gaca score`, so that token_logprobs line up)
    context: ContextSource = field(default="auto", metadata={"help": "Where the context comes from (as `gaca score`)."})
    add_special_tokens: bool = field(
        default=False, metadata={"help": "Let the tokenizer add BOS to a `prompt` (as `gaca score`)."}
    )
    strict_prefix: bool = field(
        default=False, metadata={"help": "Error where context tokens are not a prefix of context + action's."}
    )
    # optimisation
    lr: float = field(default=1e-5, metadata={"help": "Peak learning rate (after warm-up)."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    warmup_ratio: float = field(default=0.05, metadata={"help": "Fraction of the steps spent warming up linearly."})
    min_lr_ratio: float = field(default=0.0, metadata={"help": "Cosine decay floor, as a fraction of --lr."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Clip the gradient norm (0: no clipping)."})
    batch_size: int = field(default=32, metadata={"help": "Logged steps per optimiser step."})
    max_batch_tokens: int = field(
        default=8192,
        metadata={"help": "Padded tokens per micro-batch; gradients accumulate over a step's micro-batches."},
    )
    epochs: int = field(default=1, metadata={"help": "Passes over the steps (ignored with --max-steps)."})
    max_steps: int | None = field(default=None, metadata={"help": "Optimiser steps to take (overrides --epochs)."})
    max_length: int | None = field(
        default=None, metadata={"help": "Skip steps longer than this many tokens (counted)."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of data order and initialisation."})
    # parameters
    lora_r: int = field(default=0, metadata={"help": "LoRA rank (0: full fine-tuning)."})
    lora_alpha: float | None = field(
        default=None, metadata={"only": ("lora_r", "given"), "help": "LoRA α (default 2·r)."}
    )
    lora_targets: tuple[str, ...] = field(
        default=("all-linear",),
        metadata={"only": ("lora_r", "given"), "help": "Comma-separated module names, or all-linear."},
    )
    merge: bool = field(
        default=False, metadata={"help": "LoRA: save merged full weights in OUT_DIR (adapter in OUT_DIR/adapter)."}
    )
    # machine
    dtype: Literal["auto", "bf16", "fp32"] = field(
        default="auto", metadata={"help": "Compute dtype (auto: bf16 autocast on CUDA, fp32 elsewhere)."}
    )
    device: str = field(default="auto", metadata={"help": "auto (CUDA when present, else CPU) | cpu | cuda | cuda:N."})
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "Recompute activations in backward (less memory)."}
    )
    # checkpoints
    save_every: int = field(default=100, metadata={"help": "Checkpoint every N optimiser steps (0: never)."})
    keep_checkpoints: int = field(default=2, metadata={"help": "Checkpoints kept in OUT_DIR/checkpoints."})

    def __post_init__(self) -> None:
        def finite(x: float | None) -> bool:
            return x is not None and math.isfinite(x)

        check_choices(self)
        if not self.model:
            invalid(self, "model", "a local model directory, a GGUF file or a hub id (--model)")
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            invalid(
                self,
                "device",
                "auto | cpu | cuda | cuda:N (under accelerate launch / torchrun each process gets its GPU)",
            )
        if not (finite(self.lr) and self.lr > 0):
            invalid(self, "lr", "a peak learning rate > 0, e.g. 1e-5 (full fine-tuning) or 1e-4 (LoRA)")
        if not (finite(self.clip_low) and 0.0 <= self.clip_low < 1.0):
            invalid(self, "clip_low", "ε_low in [0, 1), e.g. 0.2")
        if not (finite(self.clip_high) and self.clip_high >= 0.0):
            invalid(self, "clip_high", "ε_high ≥ 0, e.g. 0.2 (0.28 in DAPO)")
        if self.is_cap is not None and not (finite(self.is_cap) and self.is_cap > 0):
            invalid(self, "is_cap", "a truncation level c > 0 for the importance weights, e.g. 2.0")
        if not (finite(self.awr_temperature) and self.awr_temperature > 0):
            invalid(self, "awr_temperature", "τ > 0, e.g. 1.0")
        if not (finite(self.awr_max_weight) and self.awr_max_weight > 0):
            invalid(self, "awr_max_weight", "a weight clip > 0, e.g. 20")
        if not finite(self.bc_threshold):
            invalid(self, "bc_threshold", "a finite advantage threshold, e.g. 0")
        if not (finite(self.kl_coef) and self.kl_coef >= 0):
            invalid(self, "kl_coef", "a coefficient ≥ 0 (0 turns the KL penalty off)")
        if not (finite(self.temperature) and self.temperature > 0):
            invalid(self, "temperature", "the sampling temperature T > 0 (logits are divided by T)")
        if not (finite(self.weight_decay) and self.weight_decay >= 0):
            invalid(self, "weight_decay", "a value ≥ 0, e.g. 0.0 or 0.01")
        if not (finite(self.warmup_ratio) and 0.0 <= self.warmup_ratio < 1.0):
            invalid(self, "warmup_ratio", "a fraction of the steps in [0, 1), e.g. 0.05")
        if not (finite(self.min_lr_ratio) and 0.0 <= self.min_lr_ratio <= 1.0):
            invalid(self, "min_lr_ratio", "a fraction of the peak lr in [0, 1] (1 = constant after warm-up)")
        if not (finite(self.max_grad_norm) and self.max_grad_norm >= 0):
            invalid(self, "max_grad_norm", "a norm > 0, e.g. 1.0, or 0 for no clipping")
        for name, low in (("batch_size", 1), ("max_batch_tokens", 2), ("epochs", 1), ("keep_checkpoints", 1)):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= low):
                invalid(self, name, f"an integer ≥ {low}")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            invalid(self, "seed", "an integer in [0, 2**32)")
        if self.max_steps is not None and not (isinstance(self.max_steps, int) and self.max_steps >= 1):
            invalid(self, "max_steps", "an integer ≥ 1, or leave it unset to train for --epochs")
        if self.max_length is not None and not (isinstance(self.max_length, int) and self.max_length >= 2):
            invalid(self, "max_length", "an integer ≥ 2 (longer steps are skipped), or leave it unset")
        if not (isinstance(self.save_every, int) and self.save_every >= 0):
            invalid(self, "save_every", "a number of optimiser steps ≥ 1, or 0 for no periodic checkpoint")
        if not (isinstance(self.lora_r, int) and self.lora_r >= 0):
            invalid(self, "lora_r", "a LoRA rank ≥ 1 (e.g. 16), or 0 for full fine-tuning")
        if self.lora_alpha is not None and not (finite(self.lora_alpha) and self.lora_alpha > 0):
            invalid(self, "lora_alpha", "a scale > 0 (default 2·r)")
        if not self.lora_targets or any(not t for t in self.lora_targets):
            invalid(self, "lora_targets", "module names such as q_proj,v_proj, or all-linear")
        if self.merge and self.lora_r == 0:
            invalid(self, "merge", "--merge only with LoRA (--lora-r > 0)")
        if self.loss != "pg" and self.is_cap is not None:
            invalid(self, "is_cap", "--is-cap only with --loss pg (ppo clips its ratio with --clip-low/--clip-high)")

    @property
    def use_lora(self) -> bool:
        return self.lora_r > 0

    @property
    def needs_behavior(self) -> bool:
        """True when the objective cannot be computed without behavior log-probs μ."""
        return self.loss == "ppo" or (self.loss == "pg" and self.is_cap is not None)

    def carries_gradient(self, advantage: np.ndarray) -> np.ndarray:
        """bool [N]: steps whose policy loss is not identically zero (the others are skipped).

        ppo and pg: A ≠ 0 (every term of their loss is a multiple of A). filtered-bc: A >
        threshold. awr: every step (exp(0/τ) = 1). A KL penalty alone does not keep a step.
        """
        if self.loss in ("ppo", "pg"):
            return advantage != 0
        if self.loss == "filtered-bc":
            return advantage > self.bc_threshold
        import numpy as np

        return np.ones(len(advantage), dtype=bool)

    def as_metadata(self) -> dict:
        out = asdict(self)
        out["lora_targets"] = list(self.lora_targets)
        return out

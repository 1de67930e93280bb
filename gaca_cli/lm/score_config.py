"""The options of `gaca score`: one frozen dataclass, with each option's default, help and validation.

Kept apart from `gaca_cli.lm.scoring` (numpy, the scoring loop, torch on use) so that the
command line reads these options without importing any of that (`gaca --help` stays fast).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Literal

from gaca_cli.config import check_choices, invalid

ContextSource = Literal["auto", "tokens", "prompt", "messages"]


@dataclass(frozen=True)
class ScoreConfig:
    """Every option of `gaca score`, validated; defaults live here and nowhere else."""

    model: str = field(
        metadata={"help": "A local model directory, a GGUF file or a hub id (HF_HUB_OFFLINE honoured).", "short": "-M"}
    )
    revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit)."})
    dtype: Literal["auto", "bf16", "fp16", "fp32"] = field(
        default="auto", metadata={"help": "Weights' dtype (auto: bf16 on CUDA, fp32 elsewhere)."}
    )
    device: str = field(default="auto", metadata={"help": "auto | cpu | cuda | cuda:N | mps."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Run the model repository's own Python code."})
    temperature: float = field(
        default=1.0,
        metadata={"help": "Divide logits by T (the behavior policy's sampling temperature).", "short": "-T"},
    )
    token_logprobs: bool = field(default=False, metadata={"help": "Also write token_logprobs (list<float32>)."})
    context: ContextSource = field(
        default="auto", metadata={"help": "Where the context comes from (auto: token ids, else prompt, else messages)."}
    )
    add_special_tokens: bool = field(
        default=False, metadata={"help": "Let the tokenizer add its special tokens (BOS) to a `prompt` text."}
    )
    strict_prefix: bool = field(
        default=False,
        metadata={"help": "Stop with an error where the context's tokens are not a prefix of context + action's."},
    )
    pack: bool = field(
        default=True, metadata={"help": "One forward per append-only trajectory (no effect on the numbers)."}
    )
    share_prefixes: bool = field(
        default=True,
        metadata={
            "help": "Forward each token prefix that several steps share (template, task, identical histories) "
            "once, and score the rest against its cached keys and values (the same numbers to float rounding)."
        },
    )
    max_batch_tokens: int = field(
        default=16384, metadata={"help": "Padded tokens per forward (halved on out-of-memory)."}
    )
    chunk_rows: int = field(
        default=4096, metadata={"help": "Rows per resumable chunk in the work directory OUT.parts/."}
    )
    resume: bool = field(default=False, metadata={"help": "Continue an interrupted run from the chunks in OUT.parts/."})

    def __post_init__(self) -> None:
        from gaca_cli.lm.models import check_device_name

        check_choices(self)
        if not self.model:
            invalid(self, "model", "a local model directory, a GGUF file or a hub id, e.g. --model ./my-model")
        try:
            check_device_name(self.device)
        except ValueError:
            invalid(self, "device", "auto | cpu | cuda | cuda:N | mps")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            invalid(self, "temperature", "a finite T > 0 (1: the model as is)")
        if self.max_batch_tokens < 1:
            invalid(self, "max_batch_tokens", "an integer ≥ 1, e.g. 16384")
        if self.chunk_rows < 1:
            invalid(self, "chunk_rows", "an integer ≥ 1, e.g. 4096")

    def plan_fingerprint(self) -> dict:
        """The options that decide the numbers and the chunk layout (checked by --resume).
        `--device` and `--max-batch-tokens` may change on resume (after an out-of-memory stop,
        say): they decide which steps share a batch, which moves fp32 results by float
        rounding only (~1e-7), as the out-of-memory back-off does within one run."""
        from gaca_cli.lm.models import model_key

        free = ("device", "trust_remote_code", "max_batch_tokens", "resume")  # not in the fingerprint
        kept = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in free}
        return kept | {"model": model_key(self.model)}

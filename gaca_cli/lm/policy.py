"""The policy being trained: made ready (dropout off, LoRA adapters), and the log-probs of its
action tokens, with logits computed only at action positions (the fast path;
tests/lm/test_train_offline.py compares it with a full-vocabulary `log_softmax` and gather)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gaca_cli.errors import GacaError
from gaca_cli.lm.train_config import TrainConfig

KEEP_MODES = ("mask", "positions", "full")


def logits_keep_mode(model) -> str:
    """How `action_logprobs` asks this model for the logits at the action positions only:

    - `mask`: `logits_to_keep` as a boolean [B, L] mask (recent transformers): exactly the
      kept positions, flattened;
    - `positions`: `logits_to_keep` as 1-D positions kept in every row (older transformers,
      where a 2-D tensor fails): the union of the rows' action positions;
    - `full`: a forward without `logits_to_keep` (models whose forward lacks it).

    Probed once per model (a peft or DDP wrapper passes the argument through) on a 2×6 batch:
    a mode is taken when its logits equal the full forward's at the kept positions."""
    import torch

    device = next(model.parameters()).device
    vocab = model.get_input_embeddings().num_embeddings
    ids = (torch.arange(12, device=device).reshape(2, 6) * 7919 + 3) % vocab
    mask = torch.zeros((2, 6), dtype=torch.bool, device=device)
    mask[0, 1:4] = True
    mask[1, 3:5] = True
    training = model.training
    model.eval()  # no dropout in the comparison
    try:
        with torch.no_grad():
            want = model(input_ids=ids, use_cache=False).logits.float()[mask]
            scale = max(1.0, float(want.abs().max()))
            for mode in ("mask", "positions"):
                try:
                    got = kept_logits(model, ids, mask, mode).float()
                except (IndexError, RuntimeError, TypeError, ValueError):
                    continue
                if got.shape == want.shape and torch.allclose(got, want, rtol=1e-4, atol=1e-4 * scale):
                    return mode
        return "full"
    finally:
        model.train(training)


def kept_logits(model, ids, keep, mode: str):
    """[keep.sum(), V] logits at the True positions of `keep` ([B, L]), in row-major order."""
    if mode == "mask":
        return model(input_ids=ids, logits_to_keep=keep, use_cache=False).logits
    if mode == "positions":
        cols = keep.any(dim=0).nonzero().squeeze(1)
        return model(input_ids=ids, logits_to_keep=cols, use_cache=False).logits[keep[:, cols]]
    if mode != "full":
        raise ValueError(f"keep mode must be one of {', '.join(KEEP_MODES)}, got {mode!r}")
    return model(input_ids=ids, use_cache=False).logits[keep]


def action_logprobs(
    model,
    sequences: Sequence[np.ndarray],
    n_context: Sequence[int],
    pad_id: int,
    device,
    temperature: float = 1.0,
    keep_mode: str | None = None,
):
    """log π(y_t | x, y_<t) of every action token of a micro-batch, float32 [Σ n_action].

    Right-padded [B, L] input with no attention mask: causal attention never looks to the
    right, so padding cannot change a real position, and SDPA keeps its causal fast path (as in
    `gaca score`). Logits are computed only at the positions that predict an action token
    (`keep_mode`, `logits_keep_mode(model)` when None: with `mask` no [B, L, V] tensor is built),
    divided by the temperature, and normalised in float32. Order: sequence by sequence, tokens
    in order (the same order as concatenating the per-sequence action arrays).
    """
    import torch

    batch = len(sequences)
    longest = max(len(s) for s in sequences)
    ids = torch.full((batch, longest), pad_id, dtype=torch.long)
    keep = torch.zeros((batch, longest), dtype=torch.bool)
    for i, (seq, n_ctx) in enumerate(zip(sequences, n_context)):
        ids[i, : len(seq)] = torch.from_numpy(np.asarray(seq, dtype=np.int64))
        keep[i, n_ctx - 1 : len(seq) - 1] = True
    targets = ids[:, 1:][keep[:, :-1]]
    ids, keep, targets = ids.to(device), keep.to(device), targets.to(device)
    logits = kept_logits(model, ids, keep, keep_mode or logits_keep_mode(model)).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def disable_dropout(model) -> None:
    """Dropout off everywhere (as TRL and verl do): the ratio π_θ/μ must be exactly 1 at the
    start. Attention modules keep their dropout rate in a float attribute."""
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        if isinstance(getattr(module, "attention_dropout", None), float):
            module.attention_dropout = 0.0


def apply_lora(model, config: TrainConfig):
    """Wrap the model with a peft LoRA adapter (r, α = 2r by default, the given targets)."""
    from peft import LoraConfig, get_peft_model

    from gaca_cli.lm.models import peft_quiet

    targets: Any = list(config.lora_targets)
    if targets == ["all-linear"]:
        targets = "all-linear"
    lora = LoraConfig(
        r=config.lora_r,
        # peft annotates lora_alpha as int, but the scale alpha/r takes any number
        lora_alpha=config.lora_alpha if config.lora_alpha is not None else 2 * config.lora_r,  # type: ignore[arg-type]
        lora_dropout=0.0,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with peft_quiet():
            return get_peft_model(model, lora)
    except ValueError as exc:
        raise GacaError(f"--lora-targets {','.join(config.lora_targets)}: {str(exc).splitlines()[0]}") from None

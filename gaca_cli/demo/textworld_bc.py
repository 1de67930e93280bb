"""Behaviour-cloning warm start: a tiny causal LM fitted to TextWorld walkthroughs.

    python -m gaca_cli.demo.textworld_bc -o /tmp/tw-bc --games 8 --steps 150

1. Play the games with the scripted policy (ε = 0: the walkthrough; ε > 0: noisy rollouts)
   and train a byte-level BPE tokenizer on the transcripts; "\\n" (the end of an assistant
   turn) is one token and the chat markers are special tokens.
2. Build a small random-weight Llama (transformers config, no download).
3. Fit it by teacher forcing on the expert's commands: (a) each walkthrough transcript is one
   sequence with the loss on every action span (command + "\\n"), (b) each step of the noisy
   rollouts is one example (its exact context ids → the expert's command), so the model also
   sees off-walkthrough states (DAgger-style labels).
4. Save model and tokenizer with save_pretrained: `collect.py --model DIR`, `gaca score
   --model DIR` and `gaca train-offline --model DIR` load it by path.

Few optimiser steps on purpose: the point is a start policy whose success rate is strictly
between 0 and 1, so that an offline update has something to improve. Plain torch +
transformers; deterministic on CPU for a given seed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gaca_cli.demo import textworld_games as tw

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", tw.SYSTEM, tw.USER, tw.ASSISTANT]


def build_tokenizer(texts: list[str], vocab_size: int = 1000):
    """A byte-level BPE tokenizer trained on `texts`; '\\n' stays a single token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # train on the texts with the chat markers removed (they are special tokens)
    plain = [t.replace(tw.SYSTEM, "\n").replace(tw.USER, "\n").replace(tw.ASSISTANT, "\n") for t in texts]
    tok.train_from_iterator(plain, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        bos_token="<|endoftext|>",
        additional_special_tokens=[tw.SYSTEM, tw.USER, tw.ASSISTANT],
    )
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    eot = fast.encode(tw.END_OF_TURN, add_special_tokens=False)
    assert len(eot) == 1, eot
    return fast


def build_model(tokenizer, hidden: int = 64, layers: int = 2, heads: int = 4, max_positions: int = 4096, seed: int = 0):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def examples_from_rows(rows: list[dict], tokenizer) -> list[tuple[list[int], list[int]]]:
    """(input ids, labels) pairs; labels are -100 except on the expert's action tokens.

    Walkthrough rollouts (every action is the expert's) give one packed sequence each;
    other steps give one example each: context ids + the expert command's tokens.
    """
    by_traj: dict[str, list[dict]] = {}
    for r in rows:
        by_traj.setdefault(r["traj_id"], []).append(r)
    out = []
    for traj in by_traj.values():
        traj.sort(key=lambda r: r["step_idx"])
        if all(r["command"] == r["expert_command"] for r in traj):
            last = traj[-1]
            ids = list(last["prompt_token_ids"]) + list(last["action_token_ids"])
            labels = [-100] * len(ids)
            for r in traj:
                start = len(r["prompt_token_ids"])
                for k in range(start, start + len(r["action_token_ids"])):
                    labels[k] = ids[k]
            out.append((ids, labels))
            continue
        for r in traj:
            if r["expert_command"] is None or r["command"] == r["expert_command"]:
                continue  # expert steps of noisy rollouts: the walkthroughs cover them
            target = tokenizer.encode(r["expert_command"] + tw.END_OF_TURN, add_special_tokens=False)
            ctx = list(r["prompt_token_ids"])
            out.append((ctx + target, [-100] * len(ctx) + target))
    return out


def fit(model, examples, steps: int, lr: float = 3e-3, batch_size: int = 8, seed: int = 0, log=None):
    """Teacher-forced cross-entropy on the labelled tokens; AdamW, linear warm-up, cosine decay."""
    import math

    import torch

    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    warmup = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    )
    model.train()
    pad = model.config.pad_token_id
    losses = []
    for step in range(steps):
        pick = torch.randint(len(examples), (min(batch_size, len(examples)),), generator=g).tolist()
        batch = [examples[i] for i in pick]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.detach().item())
        if log is not None and (step % 25 == 0 or step == steps - 1):
            log(step, losses[-1])
    model.eval()
    return losses


def warm_start(
    out_dir: Path,
    games: list[tuple[str, Any]],
    steps: int,
    noisy_rollouts: int = 4,
    epsilon: float = 0.5,
    max_steps: int = 12,
    vocab_size: int = 1000,
    hidden: int = 64,
    layers: int = 2,
    lr: float = 3e-3,
    seed: int = 0,
    log=None,
) -> dict:
    """Build tokenizer and model, fit them to the games' walkthroughs, save to `out_dir`."""
    import torch

    torch.manual_seed(seed)
    # 1. transcripts for the tokenizer (text only), then the same rollouts with token ids
    expert_text = tw.collect(games, tw.ScriptedPolicy(0.0, seed), 1, max_steps, seed)
    noisy_text = tw.collect(games, tw.ScriptedPolicy(epsilon, seed), noisy_rollouts, max_steps, seed)
    texts = expert_text["prompt"].to_pylist() + noisy_text["prompt"].to_pylist()
    texts += [a + tw.END_OF_TURN for a in noisy_text["action"].to_pylist()]
    tokenizer = build_tokenizer(texts, vocab_size)
    rows = tw.collect(games, tw.ScriptedPolicy(0.0, seed, tokenizer), 1, max_steps, seed).to_pylist()
    if noisy_rollouts:
        rows += tw.collect(
            games, tw.ScriptedPolicy(epsilon, seed, tokenizer), noisy_rollouts, max_steps, seed
        ).to_pylist()
    examples = examples_from_rows(rows, tokenizer)
    # 2-3. model and fit
    model = build_model(tokenizer, hidden=hidden, layers=layers, seed=seed)
    start = time.perf_counter()
    losses = fit(model, examples, steps, lr=lr, seed=seed, log=log)
    # 4. save
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    info = {
        "games": [name for name, _ in games],
        "examples": len(examples),
        "steps": steps,
        "final_loss": losses[-1] if losses else None,
        "fit_seconds": round(time.perf_counter() - start, 1),
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab": len(tokenizer),
        "seed": seed,
    }
    (out_dir / "bc.json").write_text(json.dumps(info, indent=2))
    return info


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-o", "--output", type=Path, required=True, help="model directory to write")
    p.add_argument("--games", type=int, default=8)
    p.add_argument("--first-game-seed", type=int, default=0)
    p.add_argument("--rooms", type=int, default=3)
    p.add_argument("--objects", type=int, default=4)
    p.add_argument("--quest-length", type=int, default=3)
    p.add_argument("--games-dir", type=Path, default=tw.DEFAULT_GAMES_DIR)
    p.add_argument("--steps", type=int, default=150, help="optimiser steps")
    p.add_argument("--noisy-rollouts", type=int, default=4, help="noisy rollouts per game for off-path states")
    p.add_argument("--epsilon", type=float, default=0.5)
    p.add_argument("--max-steps", type=int, default=12)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    specs = tw.game_specs(
        args.games, args.first_game_seed, rooms=args.rooms, objects=args.objects, quest_length=args.quest_length
    )
    games = [(s.name, tw.make_game(s, args.games_dir)) for s in specs]
    info = warm_start(
        args.output,
        games,
        args.steps,
        noisy_rollouts=args.noisy_rollouts,
        epsilon=args.epsilon,
        max_steps=args.max_steps,
        hidden=args.hidden,
        layers=args.layers,
        lr=args.lr,
        seed=args.seed,
        log=lambda s, loss: print(f"bc step {s}: loss {loss:.3f}", file=sys.stderr),
    )
    print(json.dumps(info), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

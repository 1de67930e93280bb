"""What both verl fixture scripts dump: the prompts, answers and responses, and how they become
padded token ids (no verl import here: make_fixture.py needs verl 0.9's v1 trainer,
make_fixture_versions.py runs on older releases too)."""

from __future__ import annotations

import torch

PROMPTS = [
    "You are in the hall. A brass key lies on the table. Your hands are empty.",
    "You are in the corridor. The garden door is locked. You carry a brass key.",
]
ANSWERS = ["take key", "open door with key"]
RESPONSES = [
    ["take key", "go to hall", "take key"],
    ["open door with key", "look around", "go to garden"],
]


def encode_prompt(tok, text: str) -> list[int]:
    chat = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    return tok.encode(chat, add_special_tokens=False)


def pad_rows(rows: list[list[int]], pad_id: int, left: bool) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor(
        [([pad_id] * (width - len(r)) + r) if left else (r + [pad_id] * (width - len(r))) for r in rows]
    )

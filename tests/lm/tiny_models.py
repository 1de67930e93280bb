"""Tiny causal LMs for the tests: random weights, a tokenizer trained here, saved to a local
directory and loaded through the same path users use (`--model ./dir`). No model hub."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_CORPUS = [
    "You are in the hall. A brass key lies on the table. Your hands are empty.",
    "You are in the corridor. The garden door is locked. You carry a brass key.",
    "go to corridor",
    "go to hall",
    "go to garden",
    "go to kitchen",
    "take key",
    "open door with key",
    "look around",
    "<|system|>You are an agent in a house. Task: reach the garden",
    "<|user|> <|assistant|> 0 1 2 3 4 5 6 7 8 9 north south east west inventory examine",
]


def build_tokenizer(vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on a tiny corpus, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|pad|>", bos_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(
    directory: str | Path, arch: str = "llama", seed: int = 0, chat_template: bool = True, **overrides
) -> Path:
    """Save a tiny random-weight causal LM (`llama`, `gpt2` or `qwen2`) and its tokenizer to
    `directory`; returns the directory."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

    directory = Path(directory)
    tokenizer = build_tokenizer()
    if not chat_template:
        tokenizer.chat_template = None
    vocab = len(tokenizer)
    common = dict(
        vocab_size=vocab,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if arch == "gpt2":
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=1024, **common)
    elif arch == "llama":
        config = LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            **common,
        )
    elif arch == "qwen2":
        config = Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            **common,
        )
    else:
        raise ValueError(f"unknown arch {arch!r}")
    for k, v in overrides.items():
        setattr(config, k, v)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    return directory


def _transformers_major() -> int:
    import transformers

    return int(transformers.__version__.split(".")[0])


#: GPT-2's decoder takes a cached prefix the way gaca's prefix sharing passes it from
#: transformers 5 on; with 4.x, `prefix_cache_ok` says no and gaca scores GPT-2 without sharing
GPT2_SHARES_PREFIXES = _transformers_major() >= 5


def sharing_arch(arch: str):
    """A pytest parameter for an architecture whose prefix-sharing test needs GPT2_SHARES_PREFIXES."""
    import pytest

    skip = arch == "gpt2" and not GPT2_SHARES_PREFIXES
    return pytest.param(arch, marks=pytest.mark.skipif(skip, reason="GPT-2 shares prefixes from transformers 5 on"))

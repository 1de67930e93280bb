"""examples/custom_loop.py runs on CPU with a tiny model, and its PPO step moves the weights."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_loop.py"


def test_the_custom_loop_trains(tiny_llama, capsys):
    spec = importlib.util.spec_from_file_location("custom_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from transformers import AutoModelForCausalLM

    before = AutoModelForCausalLM.from_pretrained(tiny_llama).state_dict()
    model, history = module.train(str(tiny_llama), iterations=2, group_size=3, max_new_tokens=4)
    assert len(history) == 2 and all(math.isfinite(h["loss"]) for h in history)
    moved = [name for name, value in model.state_dict().items() if not torch.equal(value, before[name])]
    assert moved  # the PPO step changed the weights
    assert "iteration 1: reward" in capsys.readouterr().out

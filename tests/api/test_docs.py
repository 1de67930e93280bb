"""Every Python block of docs/python-api.md runs, in order, in one namespace: in a folder
holding the example log as rollouts.parquet, a tiny local model in place of the hub id, and
local folders in place of the object-storage URLs."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "python-api.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def test_the_page_has_blocks_for_every_function():
    text = "\n".join(python_blocks())
    for call in ("gaca.advantages(", "gaca.compute_advantages(", "gaca.score(", "gaca.validate(", "gaca.read_log("):
        assert call in text
    assert "gaca_cli.ray.advantages(" in text and "s3://" in text


def test_every_block_runs(tmp_path, monkeypatch, tiny_llama, example_log):
    ray = pytest.importorskip("ray")
    pytest.importorskip("torch")
    shutil.copy(example_log, tmp_path / "rollouts.parquet")
    (tmp_path / "bucket" / "rollouts").mkdir(parents=True)
    shutil.copy(example_log, tmp_path / "bucket" / "rollouts" / "part-0.parquet")
    monkeypatch.chdir(tmp_path)
    replace = {
        "HuggingFaceTB/SmolLM2-135M-Instruct": str(tiny_llama),
        "s3://my-bucket/": str(tmp_path / "bucket") + "/",
    }
    namespace: dict = {}
    try:
        for block in python_blocks():
            for old, new in replace.items():
                block = block.replace(old, new)
            exec(compile(block, str(PAGE), "exec"), namespace)
    finally:
        ray.shutdown()
    assert any((tmp_path / "bucket" / "rollouts-gaca").glob("*.parquet"))

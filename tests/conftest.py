"""Shared fixtures: tiny local models (built once per session) and the example log."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_LOG = ROOT / "examples" / "rollouts.parquet"


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    from tests.lm.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama")


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory) -> Path:
    from tests.lm.tiny_models import build_model

    return build_model(tmp_path_factory.mktemp("tiny-gpt2"), arch="gpt2")


@pytest.fixture(scope="session")
def example_log() -> Path:
    return EXAMPLE_LOG

"""`gaca import`: the log formats of agent-RL frameworks, each one module here.

`FORMATS` maps a format's name (`--from`) to its module; a module is imported only when used.
"""

from __future__ import annotations

import importlib
from types import ModuleType

FORMATS: dict[str, str] = {
    "chat-jsonl": "gaca_cli.integrations.imports.chat_jsonl",
    "trl": "gaca_cli.integrations.imports.trl",
    "verl": "gaca_cli.integrations.imports.verl",
    "verl-agent": "gaca_cli.integrations.imports.verl_agent",
    "art": "gaca_cli.integrations.imports.art",
    "rllm": "gaca_cli.integrations.imports.rllm",
    "skyrl": "gaca_cli.integrations.imports.skyrl",
    "swift": "gaca_cli.integrations.imports.swift",
    "verifiers": "gaca_cli.integrations.imports.verifiers",
}


def format_module(name: str) -> ModuleType:
    """The module of format `name` (which must be a key of FORMATS)."""
    return importlib.import_module(FORMATS[name])

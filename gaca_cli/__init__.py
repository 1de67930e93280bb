"""gaca: offline credit assignment (GRPO, GiGPO, GACA) on logged LLM-agent rollouts.

`import gaca_cli as gaca`: the functions of docs/python-api.md, loaded from `gaca_cli.api` on
first use (so that `gaca --help` stays light)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["GacaError", "advantages", "compute_advantages", "import_logs", "read_log", "score", "validate"]

if TYPE_CHECKING:
    from gaca_cli.api import advantages, compute_advantages, import_logs, read_log, score, validate
    from gaca_cli.errors import GacaError


def __getattr__(name: str) -> Any:
    if name == "GacaError":
        from gaca_cli.errors import GacaError

        return GacaError
    if name in __all__:
        from gaca_cli import api

        return getattr(api, name)
    raise AttributeError(f"module 'gaca_cli' has no attribute {name!r}")

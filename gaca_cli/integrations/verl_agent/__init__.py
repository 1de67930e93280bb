"""gaca inside verl-agent (https://github.com/langfengQ/verl-agent).

- `compute_gaca_outcome_advantage` (in `advantage.py`): GACA as an advantage estimator of
  verl-agent's trainer, a drop-in beside its `compute_gigpo_outcome_advantage`.
- `export.py`: the exporter a user calls in verl-agent's rollout loop, which writes each batch
  as gaca log rows (then `gaca import --from verl-agent`).

Both import torch (and numpy) only when used, so `import gaca_cli.integrations.verl_agent`
stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_HOMES = {"compute_gaca_outcome_advantage": "advantage", "export_rollout": "export"}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)

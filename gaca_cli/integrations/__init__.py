"""Adapters for agent-RL frameworks (importers, trainer hooks)."""

"""Demos: TextWorld games and policies, the tabular ground-truth environment, `gaca demo`."""

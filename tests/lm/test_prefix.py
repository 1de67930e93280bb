"""Shared prefixes (gaca_cli/lm/prefix.py): the tree is the exact structure of shared token runs,
and scoring a suffix against a cached prefix gives the full forward's log-probs."""

from __future__ import annotations

import numpy as np
import pytest

from gaca_cli.lm.prefix import prefix_tree, shareable_lengths
from tests.lm.tiny_models import sharing_arch


def common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


def random_case(rng, n: int):
    base = rng.integers(0, 3, size=80)
    seqs, limits = [], []
    for _ in range(n):
        cut = int(rng.integers(0, 80))
        seq = np.concatenate([base[:cut], rng.integers(0, 3, size=int(rng.integers(1, 30)))])
        seqs.append(seq)
        limits.append(int(rng.integers(0, len(seq))))
    return seqs, np.array(limits, dtype=np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_tree_is_the_structure_of_shared_prefixes(seed):
    """Every sequence hangs from exactly one node; a node's prefix is shared by everything below
    it, is at least min_shared long and spans ≥ 2 sequences; and two sequences whose shareable
    tokens agree on k ≥ min_shared tokens meet at a node of depth exactly k (nothing shareable
    is forwarded twice)."""
    rng = np.random.default_rng(seed)
    seqs, limits = random_case(rng, int(rng.integers(1, 14)))
    min_shared = int(rng.integers(1, 12))
    root = prefix_tree(seqs, limits, min_shared)
    path_of: dict[int, list] = {}

    def visit(node, path):
        prefix = seqs[node.rep][: node.depth]
        below = list(node.leaves)
        for leaf in node.leaves:
            assert limits[leaf] >= node.depth and np.array_equal(seqs[leaf][: node.depth], prefix)
            assert leaf not in path_of
            path_of[leaf] = [*path, node]
        for child in node.children:
            assert child.depth > node.depth >= 0 and child.depth >= min_shared
            assert np.array_equal(seqs[child.rep][: node.depth], prefix)
            below += visit(child, [*path, node])
        if node is not root:
            assert len(below) >= 2
        return below

    assert sorted(visit(root, [])) == list(range(len(seqs)))
    for i in range(len(seqs)):
        for j in range(i + 1, len(seqs)):
            k = common(seqs[i][: limits[i]], seqs[j][: limits[j]])
            meet = [a for a, b in zip(path_of[i], path_of[j]) if a is b][-1]
            assert meet.depth == (k if k >= min_shared else 0)


def test_windowed_prompts_share_the_template_and_identical_step0_contexts():
    """Three rollouts × two steps: a 40-token template+task shared by all six, and the identical
    step-0 context (template + obs0) shared by the three step-0 rows."""
    template = np.arange(100, 140)
    obs0 = np.arange(200, 210)
    seqs, spans = [], []
    for r in range(3):
        for t in range(2):
            ctx = np.concatenate([template, obs0 if t == 0 else np.array([300 + r, 301 + r, 302])])
            action = np.array([400 + r, 401])
            seqs.append(np.concatenate([ctx, action]))
            spans.append(np.array([[len(ctx), len(ctx) + 2]]))
    limits = shareable_lengths(seqs, spans)
    assert list(limits) == [len(s) - 3 for s in seqs]  # up to the token before the last context token
    root = prefix_tree(seqs, limits, min_shared=32)
    assert root.leaves == [] and [c.depth for c in root.children] == [40]
    template_node = root.children[0]
    assert sorted(template_node.leaves) == [1, 3, 5]  # step-1 rows differ right after the template
    assert [c.depth for c in template_node.children] == [49] and sorted(template_node.children[0].leaves) == [0, 2, 4]


def test_sequences_without_shared_prefix_stay_at_the_root():
    seqs = [np.arange(50) + 100 * k for k in range(4)]
    spans = [np.array([[45, 50]]) for _ in seqs]
    root = prefix_tree(seqs, shareable_lengths(seqs, spans), min_shared=8)
    assert sorted(root.leaves) == [0, 1, 2, 3] and root.children == []


@pytest.mark.parametrize("arch", [sharing_arch(a) for a in ("llama", "gpt2", "qwen2")])
def test_suffix_against_cached_prefix_equals_the_full_forward(arch, tmp_path):
    """fp32 on CPU: log-probs of suffixes scored against a prefix cached in two extensions equal
    the plain scorer's full forwards within 1e-5, for every architecture the tests cover."""
    import torch

    from gaca_cli.lm.models import load_causal_lm
    from gaca_cli.lm.prefix import extend_prefix, prefix_cache_ok, suffix_logprobs
    from gaca_cli.lm.scoring import Scorer
    from tests.lm.tiny_models import build_model

    build_model(tmp_path, arch=arch)
    lm, _, device, _ = load_causal_lm(str(tmp_path), device="cpu", dtype="fp32")
    scorer = Scorer(lm, device)
    assert prefix_cache_ok(scorer)
    rng = np.random.default_rng(1)
    prefix = rng.integers(0, 250, 60).astype(np.int32)
    seqs = [np.concatenate([prefix, rng.integers(0, 250, k).astype(np.int32)]) for k in (4, 11, 2, 7)]
    spans = [np.array([[61, len(s)]]) if len(s) > 62 else np.array([[61, len(s)]]) for s in seqs]
    spans[1] = np.array([[63, 66], [68, 71]])  # a packed sequence: two action spans
    with torch.inference_mode():
        full = scorer.logprobs(seqs, spans)
        kv = extend_prefix(scorer, extend_prefix(scorer, None, prefix[:25]), prefix[25:60])
        cached = suffix_logprobs(scorer, kv, 60, seqs, spans)
    for a, b in zip(full, cached):
        assert a.shape == b.shape
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)


def test_packed_sequences_share_nothing():
    """A whole append-only trajectory (several action spans) is scored as today: no shared prefix."""
    seqs = [np.arange(100) for _ in range(3)]
    spans = [np.array([[40, 45], [80, 85]]) for _ in range(3)]
    assert list(shareable_lengths(seqs, spans)) == [0, 0, 0]
    root = prefix_tree(seqs, shareable_lengths(seqs, spans), min_shared=8)
    assert sorted(root.leaves) == [0, 1, 2] and root.children == []


def test_short_shared_prefixes_are_not_worth_a_cache():
    """A 40-token prefix of 400-token sequences is dissolved; one of 60-token sequences is kept."""
    from gaca_cli.lm.prefix import worth_sharing

    shared = np.arange(40)
    seqs = [np.concatenate([shared, 1000 + 10 * k + np.arange(n)]) for k, n in enumerate([360, 360, 20, 20])]
    seqs[2][40:45] = seqs[3][40:45] = 7  # the short pair shares 45 tokens, of 60
    spans = [np.array([[len(s) - 2, len(s)]]) for s in seqs]
    root = prefix_tree(seqs, shareable_lengths(seqs, spans), min_shared=32)
    assert [c.depth for c in root.children] == [40]
    worth_sharing(root, np.array([len(s) for s in seqs]))
    assert sorted(root.leaves) == [0, 1] and [c.depth for c in root.children] == [45]
    assert sorted(root.children[0].leaves) == [2, 3]

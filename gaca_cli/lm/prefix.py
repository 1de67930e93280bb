"""Shared token prefixes, forwarded once: `gaca score` on logs whose histories are windowed.

Agent loops that rebuild each prompt from a template, the task and a window of recent
(observation, action) pairs give sequences that are not prefixes of each other, so packing
(scoring.build_plan) cannot share them; yet most of every prompt (system prompt, instructions,
task, and at step 0 the whole context of every rollout in a group) is the same token run.

A prefix tree over the plan's sequences finds those runs. Each sequence may share its tokens
up to (not including) the position that predicts its first action token: every action
log-prob is then computed in the sequence's own suffix, never inside a shared prefix. A node
of the tree is a shared prefix of ≥ `min_shared` tokens held by ≥ 2 sequences; its keys and
values are computed once (extending its parent's), the suffixes of its sequences are scored
against them in batches, and its cache is freed as soon as its subtree is done (depth first,
so at most one cache per tree level is alive).

Exactness: causal attention makes position p's hidden state a function of tokens ≤ p only, so
the cached forward computes the same quantity as the full one; only the floating-point
grouping of the attention sums differs (fp32 on CPU: within 1e-5 of the full forward).
`prefix_cache_ok` checks this once per model on a probe and turns sharing off otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MIN_SHARED_TOKENS = 32  # a shorter common prefix is not worth a forward of its own
#: a shared prefix must be at least this share of its sequences' mean length: scoring against a
#: cache costs a copy of it per batch row and attention without the causal fast path, which a
#: short shared prefix does not pay back (bench/score.py: a ~10 % shared system prompt made the
#: rewritten-history log 0.9x as fast; the windowed log's ~70 % made it 1.9x as fast)
MIN_SHARED_FRACTION = 0.5
PROBE_TOLERANCE = 1e-4  # |Δ log-prob| allowed between the cached and the full forward in the probe


@dataclass
class PrefixNode:
    """A shared prefix: tokens [0, depth) of every sequence below it.

    rep:      a sequence holding the prefix (its tokens spell it)
    leaves:   sequences whose tokens from `depth` on are scored against this node's cache
    children: longer shared prefixes below this one
    """

    depth: int
    rep: int
    leaves: list[int] = field(default_factory=list)
    children: list[PrefixNode] = field(default_factory=list)

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()


def shareable_lengths(seqs: list[np.ndarray], spans: list[np.ndarray]) -> np.ndarray:
    """int64 [S] how many leading tokens of each sequence may sit in a shared prefix: up to the
    position that predicts its first action token (start − 1), the whole of it when it has none.

    A packed sequence (a whole append-only trajectory, several action spans) shares nothing: it
    already runs its history once, and sharing only its step-0 context with the group's other
    rollouts cost more (the cache copied per batch row, attention over it) than it saved
    (bench/score.py, append-only logs: 0.85x the speed without sharing)."""
    out = np.empty(len(seqs), dtype=np.int64)
    for i, (seq, sp) in enumerate(zip(seqs, spans)):
        starts = sp[sp[:, 1] > sp[:, 0], 0] if len(sp) else sp[:0, 0]
        if len(starts) > 1:
            out[i] = 0
        else:
            out[i] = max(0, int(starts.min()) - 1) if len(starts) else len(seq) - 1
    return out


def _common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def prefix_tree(seqs: list[np.ndarray], limits: np.ndarray, min_shared: int = MIN_SHARED_TOKENS) -> PrefixNode:
    """The tree of shared prefixes of the keys `seqs[i][:limits[i]]` (see the module docstring).

    The keys are sorted, so keys with a common prefix are neighbours, and the longest common
    prefix (LCP) of neighbours builds the tree with a stack holding the current root-to-leaf
    path (as a suffix tree is built from a suffix array). A common prefix shorter than
    `min_shared` is not shared: its sequences hang from the nearest longer ancestor, or from
    the root (depth 0, no cache)."""
    keys = [np.asarray(s[: int(k)], dtype=np.int64) for s, k in zip(seqs, limits)]
    order = sorted(range(len(keys)), key=lambda i: keys[i].astype(">i8").tobytes())
    root = PrefixNode(depth=0, rep=order[0] if order else 0)
    # the path from the root to the previous key's leaf; a leaf is (key length + ½, index)
    stack: list[PrefixNode | tuple[float, int]] = [root]

    def depth(x: PrefixNode | tuple[float, int]) -> float:
        return x.depth if isinstance(x, PrefixNode) else x[0]

    def attach(parent: PrefixNode | tuple[float, int], child: PrefixNode | tuple[float, int]) -> None:
        assert isinstance(parent, PrefixNode)
        if isinstance(child, PrefixNode):
            parent.children.append(child)
        else:
            parent.leaves.append(child[1])

    previous: int | None = None
    for i in order:
        lcp = _common(keys[previous], keys[i]) if previous is not None else 0
        lcp = lcp if lcp >= min_shared else 0
        while depth(stack[-1]) > lcp:
            last = stack.pop()
            if depth(stack[-1]) >= lcp:
                attach(stack[-1], last)
            else:  # the previous key and this one part between two nodes of the path: a new node
                rep = last.rep if isinstance(last, PrefixNode) else last[1]
                shared = PrefixNode(depth=lcp, rep=rep)
                attach(shared, last)
                stack.append(shared)
        stack.append((len(keys[i]) + 0.5, i))
        previous = i
    while len(stack) > 1:
        last = stack.pop()
        attach(stack[-1], last)
    return root


def worth_sharing(node: PrefixNode, lengths: np.ndarray, fraction: float = MIN_SHARED_FRACTION) -> list[int]:
    """Dissolve, in place, every shared prefix shorter than `fraction` of the mean length of the
    sequences below it: they hang from the nearest ancestor kept (or the root) instead.
    Returns the sequences below `node`."""
    below = list(node.leaves)
    kept: list[PrefixNode] = []
    for child in node.children:
        members = worth_sharing(child, lengths, fraction)
        below += members
        if child.depth >= fraction * float(np.mean(lengths[members])):
            kept.append(child)
        else:
            node.leaves += child.leaves
            kept += child.children
    node.children = kept
    return below


# --------------------------------------------------------------------------------------------
# Forwards against a cached prefix (torch)
# --------------------------------------------------------------------------------------------


def _cache(model, kv: list[tuple[Any, Any]], batch: int):
    """A fresh DynamicCache holding the prefix's keys and values for `batch` rows (views: the
    forward appends by concatenation, so the stored tensors are never written)."""
    from transformers import DynamicCache

    data = [(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in kv]
    return DynamicCache(ddp_cache_data=data, config=model.config)


def _kv_of(cache) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


_CACHE_ARGUMENT: dict[Any, str] = {}


def _cache_argument(decoder: Any) -> str:
    """transformers ≥ 5.2x names the forward's argument (and output) `cache`; earlier versions
    `past_key_values`. Read once per decoder class, not on every forward."""
    import inspect

    kind = type(decoder)
    if kind not in _CACHE_ARGUMENT:
        params = inspect.signature(decoder.forward).parameters
        _CACHE_ARGUMENT[kind] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_ARGUMENT[kind]


def _run(scorer, ids, cache):
    """The decoder's forward over `ids` after the cached prefix; returns (hidden, cache)."""
    name = _cache_argument(scorer.decoder)
    out = scorer.decoder(input_ids=ids, use_cache=True, **({name: cache} if cache is not None else {}))
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    return hidden, getattr(out, "cache", None) or getattr(out, "past_key_values", None)


def extend_prefix(scorer, kv: list[tuple[Any, Any]] | None, tokens: np.ndarray) -> list[tuple[Any, Any]]:
    """Keys and values of prefix ++ tokens, from those of the prefix (None: empty prefix)."""
    import torch

    ids = torch.from_numpy(tokens.astype(np.int64)).to(scorer.device).unsqueeze(0)
    _, cache = _run(scorer, ids, _cache(scorer.model, kv, 1) if kv is not None else None)
    return [(k.contiguous(), v.contiguous()) for k, v in _kv_of(cache)]


def suffix_logprobs(
    scorer, kv: list[tuple[Any, Any]], depth: int, seqs: list[np.ndarray], spans: list[np.ndarray]
) -> list[np.ndarray]:
    """For each sequence (sharing tokens [0, depth) whose keys and values are `kv`), float32
    log-probs of its spans' tokens, from one batched forward of the suffixes seq[depth:]."""
    return scorer.suffix_logprobs(
        seqs, spans, depth, lambda ids: _run(scorer, ids, _cache(scorer.model, kv, len(ids)))[0]
    )


def prefix_cache_ok(scorer) -> bool:
    """Does scoring a suffix against a cached prefix give the full forward's log-probs? One probe
    of 48 tokens split at 40; False for models whose decoder takes no cache this way."""
    import torch

    if not scorer.fast_head:
        return False
    n, cut = 48, 40
    seq = (np.arange(n, dtype=np.int64) * 7919 % scorer.input_vocab_size).astype(np.int32)
    spans = np.array([[cut + 1, n]], dtype=np.int64)
    try:
        with torch.inference_mode():
            full = scorer.logprobs([seq], [spans])[0]
            kv = extend_prefix(scorer, None, seq[:cut])
            cached = suffix_logprobs(scorer, kv, cut, [seq], [spans])[0]
    except Exception:  # noqa: BLE001 - any model whose decoder cannot take a cache this way scores without sharing
        return False
    if cached.shape != full.shape or not (np.isfinite(cached).all() and np.isfinite(full).all()):
        return False  # (non-finite log-probs: scoring refuses them, naming the rows)
    return bool(np.max(np.abs(cached - full), initial=0.0) <= PROBE_TOLERANCE)


def score_shared(
    scorer,
    seqs: list[np.ndarray],
    spans: list[np.ndarray],
    todo: np.ndarray,
    run_uncached: Callable[[np.ndarray], None],
    run_batches: Callable[[np.ndarray, int, Callable[[np.ndarray], list[np.ndarray]]], None],
    stats: dict,
    min_shared: int = MIN_SHARED_TOKENS,
) -> None:
    """Score the sequences `todo` with shared prefixes forwarded once.

    Sequences that share no prefix go to `run_uncached(indices)` (batched without a cached prefix).
    For each shared prefix, `run_batches(indices, depth, forward)` plans and runs the batches of
    its sequences' suffixes (counting the `depth` cached tokens each row attends to), calling
    `forward(indices) -> log-probs per sequence`; it owns the out-of-memory back-off."""
    import torch

    sub = [seqs[i] for i in todo]
    tree = prefix_tree(sub, shareable_lengths(sub, [spans[i] for i in todo]), min_shared)
    worth_sharing(tree, np.array([len(x) for x in sub], dtype=np.int64))
    run_uncached(todo[np.asarray(tree.leaves, dtype=np.int64)])

    def visit(node: PrefixNode, parent_depth: int, parent_kv) -> None:
        with torch.inference_mode():
            kv = extend_prefix(scorer, parent_kv, sub[node.rep][parent_depth : node.depth])
        stats["forwards"] += 1
        stats["forwarded_tokens"] += node.depth - parent_depth
        stats["shared_prefixes"] += 1
        if node.leaves:
            members = todo[np.asarray(node.leaves, dtype=np.int64)]

            def forward(idx: np.ndarray) -> list[np.ndarray]:
                with torch.inference_mode():
                    return suffix_logprobs(scorer, kv, node.depth, [seqs[i] for i in idx], [spans[i] for i in idx])

            run_batches(members, node.depth, forward)
        for child in node.children:
            visit(child, node.depth, kv)
        # this prefix's cache is freed when visit returns, once its subtree is scored

    for child in tree.children:
        visit(child, 0, None)

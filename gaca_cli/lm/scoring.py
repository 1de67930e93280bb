"""`gaca score` as a library call: the exact NLL of every logged action under a causal LM.

The maths. A step's context has tokens c_1..c_m and its action a_1..a_n (tokenization.py);
x = c ++ a. With h_p the model's last hidden state at 0-based position p (it predicts token
p+1), z_p = W h_p its logits and T the temperature (`--temperature`, default 1):

    log π(a_k | x_<m+k) = z_{m+k-1}[a_k] / T − logsumexp_v( z_{m+k-1}[v] / T )    (float32)
    nll_sum  = −Σ_k log π(a_k | x_<m+k)          nats, float64 sum of the float32 terms
    nll_mean = nll_sum / n                       nats per token; null when n = 0 (nll_sum = 0)

How it is made fast (README.md, docs/performance.md; the slow twin, one full-logits forward
per step, lives in the tests):
1. Trajectory packing: when step t's context + action is a prefix of step t+1's context,
   both are read from ONE forward over the longer sequence (causal attention makes the logits
   at a position independent of what follows it); every step alone when histories are rewritten.
2. Identical sequences (same tokens, same action spans) are scored once per chunk.
3. The vocabulary projection runs only at action positions, in float32 chunks of
   `HEAD_CHUNK_BYTES`; a model whose logits are more than W·h (soft-capping, scaling; checked
   once per run on a probe) falls back to its own forward.
4. Length-sorted, right-padded batches under `--max-batch-tokens`, with no attention mask
   (causal attention never looks right); halved on out-of-memory.

Scale: results go to chunk files in a work directory beside OUT (`OUT.parts/`); `--resume`
skips finished chunks; OUT is written atomically once every chunk exists, then the work
directory is removed. Under torchrun / accelerate each rank scores a share of the
trajectories (balanced by an estimate of their token count) and rank 0 merges.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gaca_cli.errors import GacaError
from gaca_cli.lm.score_config import ScoreConfig
from gaca_cli.lm.shards import (
    STOPPED,
    STOPPED_ANY,
    Agree,
    agree_alone,
    check_work_dir,
    chunk_path,
    chunk_trajectories,
    fingerprint,
    merge_work_dir,
    new_stats,
    output_table,
    prepare_work_dir,
    shard_trajectories,
    trajectory_costs,
    work_dir_for,
    write_chunk,
)

HEAD_CHUNK_BYTES = 128 * 2**20  # float32 logits materialised at once by the vocabulary projection


class Progress(Protocol):
    """How `run_score` reports as it goes: `start` once with the rows this process scores,
    then `advance` with the rows and tokens of each finished batch."""

    def start(self, total_rows: int) -> None: ...
    def advance(self, rows: int, tokens: int) -> None: ...


# --------------------------------------------------------------------------------------------
# Plans: which token sequences to run, and where each step's action sits in them (numpy only)
# --------------------------------------------------------------------------------------------


@dataclass
class ChunkPlan:
    """The forwards of one chunk.

    seqs:     unique token sequences (int32 [L] each)
    spans:    per sequence, int64 [k, 2] action spans [start, end) in it, in step order
    step_seq: int64 [n_steps]  the sequence holding each step (chunk step order)
    step_span:int64 [n_steps]  which of that sequence's spans is the step's action
    """

    seqs: list[np.ndarray]
    spans: list[np.ndarray]
    step_seq: np.ndarray
    step_span: np.ndarray
    packed_trajectories: int = 0
    segments: int = 0


def build_plan(context: list[np.ndarray], action: list[np.ndarray], traj_lengths: list[int], pack: bool) -> ChunkPlan:
    """Cut each trajectory (consecutive steps, `traj_lengths` of them each) into runs where
    step t's context + action is a prefix of step t+1's context; one sequence per run, and
    identical (sequence, spans) pairs kept once."""
    seqs: list[np.ndarray] = []
    spans: list[np.ndarray] = []
    seen: dict[bytes, int] = {}
    n = len(context)
    step_seq = np.empty(n, dtype=np.int64)
    step_span = np.empty(n, dtype=np.int64)
    packed = segments = 0
    start = 0
    for length in traj_lengths:
        runs_here = 0
        a = start
        while a < start + length:
            b = a
            full = np.concatenate([context[b], action[b]])
            while pack and b + 1 < start + length:
                nxt = context[b + 1]
                if len(nxt) >= len(full) and np.array_equal(nxt[: len(full)], full):
                    b += 1
                    full = np.concatenate([context[b], action[b]])
                else:
                    break
            run_spans = np.array(
                [[len(context[s]), len(context[s]) + len(action[s])] for s in range(a, b + 1)], dtype=np.int64
            ).reshape(-1, 2)
            key = hashlib.blake2b(full.astype(np.int32).tobytes() + b"|" + run_spans.tobytes(), digest_size=20).digest()
            idx = seen.get(key)
            if idx is None:
                idx = seen[key] = len(seqs)
                seqs.append(full.astype(np.int32, copy=False))
                spans.append(run_spans)
            step_seq[a : b + 1] = idx
            step_span[a : b + 1] = np.arange(b + 1 - a)
            runs_here += 1
            a = b + 1
        segments += runs_here
        packed += int(length > 1 and runs_here == 1)
        start += length
    return ChunkPlan(seqs, spans, step_seq, step_span, packed_trajectories=packed, segments=segments)


def plan_batches(lengths: np.ndarray, max_batch_tokens: int) -> list[np.ndarray]:
    """Longest first (ties in input order), greedy: a batch holds sequences while
    n × (its longest length) ≤ max_batch_tokens; a longer sequence goes alone."""
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    batches: list[np.ndarray] = []
    i = 0
    while i < len(order):
        longest = max(int(lengths[order[i]]), 1)
        size = max(1, max_batch_tokens // longest)
        batches.append(order[i : i + size])
        i += size
    return batches


# --------------------------------------------------------------------------------------------
# Forwards (torch)
# --------------------------------------------------------------------------------------------


class PeerStopped(GacaError):
    """Another rank stopped on an error (which it reports); this one stops at its next chunk."""


class OutOfMemory(GacaError):
    """A sequence that does not fit the device even alone: not a problem of the data, so the
    chunks scored so far stay in the work directory for `--resume` (on another device, say)."""


def is_out_of_memory(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)):  # torch < 2.5: cuda's
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


class Scorer:
    """Per-token action log-probabilities for batches of sequences, on one model."""

    def __init__(self, model, device, temperature: float = 1.0):
        import torch

        from gaca_cli.lm.models import position_limit

        self.model = model
        self.device = device
        self.temperature = float(temperature)
        self.head = model.get_output_embeddings()
        self.vocab_size = int(self.head.weight.shape[0])
        self.input_vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.position_limit = position_limit(model)  # learned positions: the longest sequence
        self.pad_id = 0
        try:
            decoder = model.get_decoder()
        except (AttributeError, NotImplementedError):
            decoder = None
        self.decoder = decoder if decoder is not None and decoder is not model else None
        self.head_chunk_rows = max(1, HEAD_CHUNK_BYTES // (4 * self.vocab_size))
        import inspect

        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        with torch.inference_mode():
            self.fast_head = self.decoder is not None and self._probe()

    def _probe(self) -> bool:
        """Does W·h of the decoder's last hidden state equal the model's own logits?"""
        import torch

        n = min(16, self.input_vocab_size)
        ids = (torch.arange(n, device=self.device) * 7919 % self.input_vocab_size).unsqueeze(0)
        full = self.model(input_ids=ids, use_cache=False).logits.float()
        try:
            fast = self.head(self._hidden(ids)).float()
        except Exception:  # noqa: BLE001 - any decoder that cannot run alone takes the slow path
            return False
        scale = max(1.0, float(full.abs().max()))
        return fast.shape == full.shape and bool(torch.allclose(fast, full, rtol=1e-3, atol=1e-3 * scale))

    def _hidden(self, ids):
        assert self.decoder is not None, "the fast head needs the model's decoder"
        out = self.decoder(input_ids=ids, use_cache=False)
        return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]

    def _logprobs_at(self, rows_logits_fn, n: int, targets):
        """float32 [n] log-probs of `targets`, the logits made `head_chunk_rows` rows at a time."""
        import torch

        out = torch.empty(n, dtype=torch.float32, device=self.device)
        for i in range(0, n, self.head_chunk_rows):
            j = min(n, i + self.head_chunk_rows)
            logits = rows_logits_fn(i, j).float()
            if self.temperature != 1.0:
                logits = logits / self.temperature
            out[i:j] = logits.gather(1, targets[i:j, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)
        return out

    def logprobs(self, seqs: list[np.ndarray], spans: list[np.ndarray]) -> list[np.ndarray]:
        """For each sequence, float32 log-probs of the tokens in its spans (spans in order)."""
        import torch

        with torch.inference_mode():
            if self.fast_head:
                return self.suffix_logprobs(seqs, spans, 0, self._hidden)
            return [self._logprobs_model(s, sp) for s, sp in zip(seqs, spans)]

    def _positions(self, spans: np.ndarray, row: int, width: int) -> tuple[np.ndarray, np.ndarray]:
        """Flat indices (row·width + p − 1) of the hidden states predicting each action token."""
        pos = (
            np.concatenate([np.arange(s, e, dtype=np.int64) for s, e in spans]) if len(spans) else np.zeros(0, np.int64)
        )
        return row * width + pos - 1, pos

    def suffix_logprobs(
        self, seqs: list[np.ndarray], spans: list[np.ndarray], depth: int, hidden_of: Callable[[Any], Any]
    ) -> list[np.ndarray]:
        """For each sequence, float32 log-probs of its spans' tokens from one batched forward of the
        suffixes seq[depth:] (`hidden_of(ids)`: the decoder's last hidden states, after the `depth`
        tokens all the sequences share when depth > 0), the head applied at action positions only."""
        import torch

        tails = [s[depth:] for s in seqs]
        width = max(len(t) for t in tails)
        ids = np.full((len(tails), width), self.pad_id, dtype=np.int64)
        flat_parts, target_parts, counts = [], [], []
        for b, (seq, tail, sp) in enumerate(zip(seqs, tails, spans)):
            ids[b, : len(tail)] = tail
            flat, pos = self._positions(sp, b, width)
            flat_parts.append(flat - depth)
            target_parts.append(seq[pos].astype(np.int64))
            counts.append(len(pos))
        where = torch.from_numpy(np.concatenate(flat_parts)).to(self.device)
        targets = torch.from_numpy(np.concatenate(target_parts)).to(self.device)
        hidden = hidden_of(torch.from_numpy(ids).to(self.device))  # [B, L, d]
        chosen = hidden.reshape(-1, hidden.shape[-1]).index_select(0, where)  # [n_action_tokens, d]
        del hidden
        lp = self._logprobs_at(lambda i, j: self.head(chosen[i:j]), len(where), targets)
        return np.split(lp.cpu().numpy(), np.cumsum(counts)[:-1])

    def _logprobs_model(self, seq: np.ndarray, spans: np.ndarray) -> np.ndarray:
        """The model's own forward (its logit post-processing included), one sequence."""
        import torch

        _, pos = self._positions(spans, 0, len(seq))
        if len(pos) == 0:
            return np.zeros(0, dtype=np.float32)
        ids = torch.from_numpy(seq.astype(np.int64)).to(self.device).unsqueeze(0)
        keep = torch.from_numpy(pos - 1).to(self.device)
        if self._keeps_logits:
            logits = self.model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits[0]
        else:
            logits = self.model(input_ids=ids, use_cache=False).logits[0].index_select(0, keep)
        targets = torch.from_numpy(seq[pos].astype(np.int64)).to(self.device)
        return self._logprobs_at(lambda i, j: logits[i:j], len(pos), targets).cpu().numpy()

    @functools.cached_property
    def shares_prefixes(self) -> bool:
        """Does scoring against a cached prefix give this model's full-forward log-probs? (probed
        once, gaca_cli.lm.prefix.prefix_cache_ok)"""
        from gaca_cli.lm.prefix import prefix_cache_ok

        return prefix_cache_ok(self)

    def free(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def score_plan(
    scorer: Scorer,
    plan: ChunkPlan,
    max_batch_tokens: int,
    stats: dict,
    on_batch: Callable[[np.ndarray], None] | None = None,
    share_prefixes: bool = False,
) -> list[np.ndarray]:
    """Run every sequence of the plan; per sequence, its spans' log-probs concatenated.

    With `share_prefixes` (and a model whose cached forward passes `prefix.prefix_cache_ok`),
    token prefixes shared by several sequences are forwarded once and the rest of each
    sequence is scored against their keys and values (gaca_cli.lm.prefix). Batches count the
    cached tokens each row attends to against `max_batch_tokens`."""
    results: list[np.ndarray | None] = [None] * len(plan.seqs)
    lengths = np.array([len(s) for s in plan.seqs], dtype=np.int64)

    def uncached(idx: np.ndarray) -> list[np.ndarray]:
        return scorer.logprobs([plan.seqs[i] for i in idx], [plan.spans[i] for i in idx])

    def run(idx: np.ndarray, forward: Callable[[np.ndarray], list[np.ndarray]], depth: int) -> None:
        """One batch: `depth` leading tokens of each sequence come from a cached prefix."""
        failed = False
        try:
            lps = forward(idx)
        except Exception as exc:  # noqa: BLE001 - only out-of-memory is handled, the rest re-raised
            if not is_out_of_memory(exc):
                raise
            failed = True
        if not failed:
            for i, lp in zip(idx, lps):
                results[i] = lp
            stats["forwards"] += 1
            stats["padded_tokens"] += int(len(idx) * lengths[idx].max())
            stats["forwarded_tokens"] += int(np.sum(lengths[idx] - depth))
            return
        scorer.free()
        stats["oom_backoffs"] += 1
        if len(idx) > 1:
            half = len(idx) // 2
            run(idx[:half], forward, depth)
            run(idx[half:], forward, depth)
            return
        i = int(idx[0])
        if depth == 0 and len(plan.spans[i]) > 1:  # a packed sequence that does not fit: its steps one by one
            parts = []
            for s, e in plan.spans[i]:
                sub = ChunkPlan([plan.seqs[i][:e]], [np.array([[s, e]])], np.zeros(1, np.int64), np.zeros(1, np.int64))
                parts.extend(score_plan(scorer, sub, max_batch_tokens, stats))
            results[i] = np.concatenate(parts)
            return
        raise OutOfMemory(
            f"out of memory on {scorer.device} for a single sequence of {lengths[i]:,} tokens; "
            "the chunks scored so far are kept: --resume on another --device with the same --dtype "
            "continues them; or start again with --dtype bf16 or a smaller model"
        )

    def batches(idx: np.ndarray, depth: int, forward: Callable[[np.ndarray], list[np.ndarray]]) -> None:
        for batch in plan_batches(lengths[idx], max_batch_tokens):  # lengths include the cached tokens
            run(idx[batch], forward, depth)
            if on_batch is not None:
                on_batch(idx[batch])

    n_action = np.array([int(np.sum(sp[:, 1] - sp[:, 0])) for sp in plan.spans], dtype=np.int64)
    for i in np.flatnonzero(n_action == 0):  # nothing to predict: no forward
        results[i] = np.zeros(0, dtype=np.float32)
    todo = np.flatnonzero(n_action > 0)
    if share_prefixes and len(todo) > 1 and scorer.shares_prefixes:
        from gaca_cli.lm.prefix import score_shared

        score_shared(scorer, plan.seqs, plan.spans, todo, lambda idx: batches(idx, 0, uncached), batches, stats)
    else:
        batches(todo, 0, uncached)
    return results  # type: ignore[return-value]


def _check_finite(nll_sum: np.ndarray, log, rows: np.ndarray, config: ScoreConfig, model) -> None:
    """Refuse NaN or ±inf NLLs (nothing is written): a temperature so small that the logits
    overflow, a model whose activations do in its half-precision dtype, or one that gives
    them in float32 too (NaN in its weights, say)."""
    bad = ~np.isfinite(nll_sum)
    if not bad.any():
        return
    import torch

    from gaca_cli.log.checks import rows_text

    dtype = next(model.parameters()).dtype
    if config.temperature < 1.0:
        why = f"-T {config.temperature:g} divides the logits into overflow: use a larger temperature"
    elif dtype in (torch.bfloat16, torch.float16):
        why = f"the model's activations overflow in {str(dtype).removeprefix('torch.')}: try --dtype fp32"
    else:
        why = f"in {str(dtype).removeprefix('torch.')}: check the model's weights for NaN or ±inf"
    raise GacaError(
        f"the model gives a non-finite NLL ({why})",
        file=config.model,
        rows=rows_text(log.table, rows[bad]),
        n_rows=int(bad.sum()),
    )


def score_shard(
    log,
    index,
    config: ScoreConfig,
    scorer: Scorer,
    tokenizer,
    work_dir: Path,
    *,
    rank: int = 0,
    world: int = 1,
    progress: Progress | None = None,
    on_chunk: Callable[[int], None] | None = None,
) -> dict:
    """Score this rank's trajectories chunk by chunk into `work_dir`, skipping the chunks that
    are already there. Returns this run's counters (`resumed_chunks`, `tokens_this_run`)."""
    from gaca_cli.lm.tokenization import FROM_MESSAGES, FROM_PROMPT, FROM_TOKEN_IDS, check_positions, tokenize_steps
    from gaca_cli.log.checks import rows_text

    rank_of = shard_trajectories(trajectory_costs(log, index), world) if world > 1 else np.zeros(index.n_traj, np.int64)
    mine = np.flatnonzero(rank_of == rank)
    chunks = chunk_trajectories(mine, index.traj_len, config.chunk_rows)
    if progress is not None:
        progress.start(int(index.traj_len[mine].sum()))
    run = {"resumed_chunks": 0, "tokens_this_run": 0, "chunks": len(chunks)}
    for k, trajs in enumerate(chunks):
        if world > 1 and any(work_dir.glob(STOPPED_ANY)):
            raise PeerStopped("another process stopped on the error above; nothing was written", file=str(work_dir))
        path = chunk_path(work_dir, rank, world, k)
        lengths = index.traj_len[trajs]
        if path.exists():
            run["resumed_chunks"] += 1
            if progress is not None:
                progress.advance(int(lengths.sum()), 0)
            continue
        pos = np.concatenate([np.arange(index.traj_start[t], index.traj_start[t] + index.traj_len[t]) for t in trajs])
        rows = index.order[pos]
        tokens = tokenize_steps(log, rows, tokenizer, config, vocab_size=scorer.input_vocab_size)
        lengths_of_steps = np.array([len(c) + len(a) for c, a in zip(tokens.context, tokens.action)], dtype=np.int64)
        check_positions(log, rows, lengths_of_steps, tokens.source, scorer.position_limit)
        plan = build_plan(tokens.context, tokens.action, [int(x) for x in lengths], config.pack)
        stats = new_stats()
        steps_of_seq = np.bincount(plan.step_seq, minlength=len(plan.seqs))

        def on_batch(batch: np.ndarray, steps_of_seq: np.ndarray = steps_of_seq, plan: ChunkPlan = plan) -> None:
            if progress is not None:
                progress.advance(int(steps_of_seq[batch].sum()), int(sum(len(plan.seqs[i]) for i in batch)))

        per_seq = score_plan(scorer, plan, config.max_batch_tokens, stats, on_batch, config.share_prefixes)
        # each step's slice of its sequence's log-probs
        offsets = [np.concatenate([[0], np.cumsum(sp[:, 1] - sp[:, 0])]) for sp in plan.spans]
        step_lps = [per_seq[s][offsets[s][j] : offsets[s][j + 1]] for s, j in zip(plan.step_seq, plan.step_span)]
        n_tokens = np.array([len(x) for x in step_lps], dtype=np.int32)
        nll_sum = np.array([-float(np.sum(x, dtype=np.float64)) for x in step_lps], dtype=np.float64)
        nll_sum[n_tokens == 0] = 0.0
        _check_finite(nll_sum, log, rows, config, scorer.model)
        stats.update(
            rows=len(pos),
            trajectories=len(trajs),
            packed_trajectories=plan.packed_trajectories,
            segments=plan.segments,
            unique_sequences=len(plan.seqs),
            duplicate_sequences=plan.segments - len(plan.seqs),
            tokens=int(sum(len(s) for s, sp in zip(plan.seqs, plan.spans) if np.any(sp[:, 1] > sp[:, 0]))),
            action_tokens=int(n_tokens.sum()),
            empty_actions=int(np.sum(n_tokens == 0)),
            prefix_mismatch_rows=int(tokens.prefix_mismatch.sum()),
            prefix_mismatch_examples=rows_text(log.table, rows[tokens.prefix_mismatch]),
            from_token_ids=int(np.sum(tokens.source == FROM_TOKEN_IDS)),
            from_prompt=int(np.sum(tokens.source == FROM_PROMPT)),
            from_messages=int(np.sum(tokens.source == FROM_MESSAGES)),
        )
        write_chunk(path, pos, nll_sum, n_tokens, step_lps if config.token_logprobs else None, stats)
        run["tokens_this_run"] += stats["tokens"]
        if on_chunk is not None:
            on_chunk(k)
    return run


# --------------------------------------------------------------------------------------------
# The whole run
# --------------------------------------------------------------------------------------------


@dataclass
class ScoreRun:
    summary: dict
    table: Any = None  # the written table (rank 0 only)
    metadata: dict = field(default_factory=dict)


def run_score(
    log,
    config: ScoreConfig,
    out: str | os.PathLike,
    *,
    rank: int = 0,
    world: int = 1,
    barrier: Callable[[], None] = lambda: None,
    agree: Agree = agree_alone,
    progress: Progress | None = None,
    on_chunk: Callable[[int], None] | None = None,
    loaded: tuple | None = None,
) -> ScoreRun:
    """Check the log, load the model, score this rank's share into the work directory, and
    (rank 0) merge everything into OUT atomically. `loaded` = load_causal_lm's result, to
    reuse a model already in memory."""
    from gaca_cli.files import discard_dir
    from gaca_cli.interrupts import ctrl_c_ignored
    from gaca_cli.lm.models import dtype_name, load_causal_lm, resolve_device, resolve_dtype
    from gaca_cli.log.checks import prepare_log
    from gaca_cli.log.writing import write_parquet_atomic

    t0 = time.perf_counter()
    index, warnings = prepare_log(log, "score")
    work_dir = work_dir_for(out)
    planned_dtype = resolve_dtype(config.dtype, resolve_device(config.device)) if loaded is None else loaded[3]
    run_fingerprint = fingerprint(log, index, config, world, dtype_name(planned_dtype))
    if rank == 0:
        check_work_dir(work_dir, run_fingerprint, config.resume)  # before the (slow) model load
    if loaded is None:
        loaded = load_causal_lm(
            config.model,
            revision=config.revision,
            dtype=config.dtype,
            device=config.device,
            trust_remote_code=config.trust_remote_code,
        )
    model, tokenizer, device, dtype = loaded
    scorer = Scorer(model, device, config.temperature)
    if rank == 0:
        prepare_work_dir(work_dir, run_fingerprint, config.resume)
    barrier()
    error: GacaError | None = None
    try:
        run = score_shard(
            log,
            index,
            config,
            scorer,
            tokenizer,
            work_dir,
            rank=rank,
            world=world,
            progress=progress,
            on_chunk=on_chunk,
        )
    except GacaError as exc:
        error = exc
        if world > 1 and not isinstance(exc, PeerStopped):
            (work_dir / STOPPED.format(rank=rank)).touch()
    barrier()
    # every rank learns whether one stopped on an error (the others would wait for it forever)
    own = error is not None and not isinstance(error, PeerStopped)
    failed, data_error = agree([int(error is not None), int(own and not isinstance(error, OutOfMemory))])
    if failed:
        # a data or model problem: fixing it changes the inputs or options, so these chunks
        # could never be resumed (an interruption or a sequence too big for the device, by
        # contrast, keeps them); every rank has stopped writing by now
        if rank == 0:
            if data_error:
                discard_dir(work_dir, out)
            else:
                for marker in work_dir.glob(STOPPED_ANY):
                    marker.unlink(missing_ok=True)
        raise error or GacaError("another process stopped on the error above; nothing was written", file=str(out))
    model_meta = {
        "model": config.model,
        "revision": config.revision,
        "commit": getattr(model.config, "_commit_hash", None),
        "dtype": dtype_name(dtype),
        "temperature": config.temperature,
        "context": config.context,
        "add_special_tokens": config.add_special_tokens,
        "token_logprobs": config.token_logprobs,
    }
    # this invocation's counters over every rank (a collective: every rank calls it)
    run["resumed_chunks"], run["tokens_this_run"] = agree([run["resumed_chunks"], run["tokens_this_run"]], "sum")
    summary = {"rank": rank, "world_size": world, **run}
    if rank != 0:
        return ScoreRun(summary=summary)
    scores = merge_work_dir(log, index, config, work_dir, world)
    table, metadata = output_table(log, config, scores, model_meta)
    write_parquet_atomic(table, out, metadata)
    with ctrl_c_ignored():  # OUT is complete: a Ctrl-C now would only leave the clean-up half done
        discard_dir(work_dir, out)
    wall = time.perf_counter() - t0
    s = scores.stats
    scored = scores.n_action_tokens > 0
    summary = {
        "output": str(out),
        **{k: v for k, v in model_meta.items() if k in ("model", "revision", "dtype", "temperature")},
        "device": str(device),
        "rows": index.n_rows,
        "trajectories": index.n_traj,
        "packed_trajectories": s["packed_trajectories"],
        "sequences": s["segments"],
        **{k: s[k] for k in ("unique_sequences", "duplicate_sequences", "forwards", "tokens", "padded_tokens")},
        **{k: s[k] for k in ("forwarded_tokens", "shared_prefixes", "action_tokens", "empty_actions")},
        **{k: s[k] for k in ("prefix_mismatch_rows", "prefix_mismatch_examples")},
        "context_sources": {
            "token_ids": s["from_token_ids"],
            "prompt": s["from_prompt"],
            "messages": s["from_messages"],
        },
        "mean_nll_per_token": (
            float(scores.nll_sum[scored].sum() / scores.n_action_tokens[scored].sum()) if scored.any() else None
        ),
        "oom_backoffs": s["oom_backoffs"],
        "fast_head": scorer.fast_head,
        "world_size": world,
        "chunks": scores.chunks,
        "resumed_chunks": run["resumed_chunks"],
        "wall_s": round(wall, 3),
        "tokens_per_s": _tokens_per_s(run, wall),
        "warnings": dict(warnings),
    }
    return ScoreRun(summary=summary, table=table, metadata=metadata)


def _tokens_per_s(run: dict, wall: float) -> float | None:
    """Tokens scored per second by this invocation, over every rank."""
    return round(run["tokens_this_run"] / wall, 1) if wall > 0 else None

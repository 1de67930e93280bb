"""From log rows to token sequences: each step's context tokens and action tokens.

Where each step's tokens come from (`--context auto`, per row, first that applies):
1. `prompt_token_ids` and `action_token_ids`, both present and not null: used as logged.
2. `prompt` (exact text after chat templating), else `messages` rendered with the tokenizer's
   chat template with the generation prompt added.

For text, the action's tokens are what tokenising context + action adds after the context's
tokens:  ctx = tok(context),  full = tok(context + action),  action = full[len(ctx):].
That is only right when `ctx` is a prefix of `full` (BPE may merge across the boundary, e.g.
a context ending in a space). Where the prefix rule fails the row is counted and reported,
and its action is scored as tok(action) on its own after `ctx` (the tokens a policy that
stopped after `ctx` would have had to sample); `--strict-prefix` makes it an error instead.
Positions are never shifted silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gaca_cli.errors import GacaError
from gaca_cli.log import columns as C
from gaca_cli.log.checks import row_violation
from gaca_cli.log.grouping import contiguous_decoded
from gaca_cli.log.reading import Log
from gaca_cli.log.widening import widest_type

if TYPE_CHECKING:
    from gaca_cli.lm.score_config import ScoreConfig
    from gaca_cli.lm.train_config import TrainConfig

#: where a step's tokens came from (StepTokens.source)
FROM_TOKEN_IDS, FROM_PROMPT, FROM_MESSAGES = 0, 1, 2
#: the column a step's context came from, by its source, for errors about it
CONTEXT_COLUMN = {FROM_TOKEN_IDS: C.PROMPT_TOKEN_IDS, FROM_PROMPT: C.PROMPT, FROM_MESSAGES: C.MESSAGES}

_TOKENIZE_BATCH = 256  # texts per tokenizer call (bounds the Python lists it returns)


@dataclass(frozen=True)
class StepTokens:
    """Tokens of a set of steps, aligned with the `rows` they were built from.

    context:         list of int32 [n_ctx] arrays
    action:          list of int32 [n_act] arrays
    source:          int8 [n]  FROM_TOKEN_IDS | FROM_PROMPT | FROM_MESSAGES
    prefix_mismatch: bool [n]  context tokens were not a prefix of context+action tokens
    """

    context: list[np.ndarray]
    action: list[np.ndarray]
    source: np.ndarray
    prefix_mismatch: np.ndarray


def text_source(log: Log, context: str) -> str | None:
    """The text column contexts come from (prompt wins over messages under auto), or None."""
    names = log.table.column_names
    if context in ("prompt", "messages"):
        if context not in names:
            raise GacaError(f"--context {context} needs a column '{context}'", file=log.source, column=context)
        return context
    return next((name for name in (C.PROMPT, C.MESSAGES) if name in names), None)


def _rows_of(log: Log, name: str, rows: np.ndarray) -> pa.ChunkedArray:
    """The values of column `name` at `rows`. A column holding views (string_view, as polars
    hands pyarrow its text), which pyarrow 26 cannot take rows from, is cast once per log to
    the same values as large_string."""
    col = log.table.column(name)
    if _holds_views(col.type):
        col = log.cached(("rows_of", name), lambda: log.table.column(name).cast(widest_type(col.type)))
    return col.take(pa.array(rows))


def _holds_views(t: pa.DataType) -> bool:
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return True
    return any(_holds_views(t.field(i).type) for i in range(t.num_fields))


def _token_lists(col: pa.ChunkedArray, rows: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """int32 arrays of a list<int> column at `rows`, and a bool mask of the non-null ones."""
    arr = contiguous_decoded(col.take(pa.array(rows)))
    valid = ~pc.is_null(arr).to_numpy(zero_copy_only=False)
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(arr).to_numpy(zero_copy_only=False)
    if flat.dtype.kind not in "iu" and len(flat):  # nulls inside a list (read as floats)
        raise ValueError("null token id")
    flat = flat.astype(np.int64, copy=False)
    return np.split(flat, np.cumsum(lengths)[:-1]) if len(rows) else [], valid


def _render_messages(log: Log, tokenizer, rows: np.ndarray, model: str) -> list[str]:
    if not getattr(tokenizer, "chat_template", None):
        raise GacaError(
            "the tokenizer has no chat template, so 'messages' cannot be rendered; "
            "log a 'prompt' column (the text after templating) or token ids instead",
            file=model,
            column=log.original_name(C.MESSAGES),
        )
    chats = _rows_of(log, C.MESSAGES, rows).to_pylist()
    out = []
    for row, chat in zip(rows, chats):
        try:
            text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja errors of the model's own template: a data/model problem
            raise row_violation(
                log, C.MESSAGES, f"the chat template cannot render this chat ({exc})", np.array([row])
            ) from None
        out.append(text)
    return out


def _tokenize(tokenizer, texts: list[str], add_special_tokens: bool) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for i in range(0, len(texts), _TOKENIZE_BATCH):
        enc = tokenizer(
            texts[i : i + _TOKENIZE_BATCH], add_special_tokens=add_special_tokens, return_attention_mask=False
        )["input_ids"]
        out.extend(np.asarray(ids, dtype=np.int64) for ids in enc)
    return out


def tokenize_steps(
    log: Log, rows: np.ndarray, tokenizer, options: ScoreConfig | TrainConfig, vocab_size: int | None = None
) -> StepTokens:
    """Context and action tokens of the original rows `rows` (see the module docstring), under
    the command's --context, --add-special-tokens, --strict-prefix (`options`; --model names
    the tokenizer in errors).

    Raises GacaError for rows that have neither usable token ids nor text, token ids outside
    the vocabulary, an empty context before a non-empty action, and (with strict_prefix) rows
    that break the prefix rule.
    """
    table = log.table
    names = table.column_names
    rows = np.asarray(rows, dtype=np.int64)
    n = len(rows)
    context = options.context
    ctx: list[np.ndarray | None] = [None] * n
    act: list[np.ndarray | None] = [None] * n
    source = np.full(n, -1, dtype=np.int8)
    mismatch = np.zeros(n, dtype=bool)

    has_ids = C.PROMPT_TOKEN_IDS in names and C.ACTION_TOKEN_IDS in names
    if context == "tokens" and not has_ids:
        missing = C.PROMPT_TOKEN_IDS if C.PROMPT_TOKEN_IDS not in names else C.ACTION_TOKEN_IDS
        raise GacaError(
            "--context tokens needs the columns 'prompt_token_ids' and 'action_token_ids'",
            file=log.source,
            column=missing,
        )
    if has_ids and context in ("auto", "tokens"):
        lists = {}
        for name in (C.PROMPT_TOKEN_IDS, C.ACTION_TOKEN_IDS):
            try:
                lists[name] = _token_lists(table.column(name), rows)
            except ValueError:
                raise GacaError(
                    "token id lists must not contain nulls", file=log.source, column=log.original_name(name)
                ) from None
        (p_ids, p_ok), (a_ids, a_ok) = lists[C.PROMPT_TOKEN_IDS], lists[C.ACTION_TOKEN_IDS]
        use = p_ok & a_ok
        if context == "tokens" and not use.all():
            raise row_violation(log, C.PROMPT_TOKEN_IDS, "--context tokens: token ids are null", rows[~use])
        for i in np.flatnonzero(use):
            ctx[i], act[i] = p_ids[i], a_ids[i]
            source[i] = FROM_TOKEN_IDS

    need_text = np.flatnonzero(source < 0)
    if len(need_text):
        text_col = text_source(log, context)
        if text_col is None or C.ACTION not in names:
            what = "'prompt' or 'messages'" if text_col is None else "'action'"
            rule = f"these rows have no token ids, and the log has no column {what} to tokenise"
            raise row_violation(log, C.PROMPT if text_col is None else C.ACTION, rule, rows[need_text])
        text_rows = rows[need_text]
        if text_col == C.PROMPT:
            contexts = _rows_of(log, C.PROMPT, text_rows).to_pylist()
            special = options.add_special_tokens
        else:
            contexts = _render_messages(log, tokenizer, text_rows, options.model)
            special = False  # a chat template writes its own special tokens
        actions = _rows_of(log, C.ACTION, text_rows).to_pylist()
        ctx_tok = _tokenize(tokenizer, contexts, special)
        full_tok = _tokenize(tokenizer, [c + a for c, a in zip(contexts, actions)], special)
        bad: list[int] = []
        for j, i in enumerate(need_text):
            c, f = ctx_tok[j], full_tok[j]
            ctx[i] = c
            source[i] = FROM_PROMPT if text_col == C.PROMPT else FROM_MESSAGES
            if len(f) >= len(c) and np.array_equal(f[: len(c)], c):
                act[i] = f[len(c) :]
            else:
                mismatch[i] = True
                bad.append(j)
        if bad:
            if options.strict_prefix:
                raise row_violation(
                    log,
                    C.ACTION,
                    "the context's tokens are not a prefix of the tokens of context + action "
                    "(drop --strict-prefix to score the action tokenised on its own)",
                    text_rows[bad],
                )
            alone = _tokenize(tokenizer, [actions[j] for j in bad], False)
            for j, a in zip(bad, alone):
                act[need_text[j]] = a

    _check_ranges(log, rows, ctx, act, vocab_size)
    ctx_arr: list[np.ndarray] = [np.asarray(c, dtype=np.int32) for c in ctx]
    act_arr: list[np.ndarray] = [np.asarray(a, dtype=np.int32) for a in act]
    empty_ctx = np.array([len(c) == 0 and len(a) > 0 for c, a in zip(ctx_arr, act_arr)], dtype=bool)
    if empty_ctx.any():
        column = CONTEXT_COLUMN[int(source[np.flatnonzero(empty_ctx)[0]])]  # the first such row's
        hint = "" if column == C.PROMPT_TOKEN_IDS else " (try --add-special-tokens to start with the BOS token)"
        rule = f"the context has no tokens, so the first action token has nothing to be predicted from{hint}"
        raise row_violation(log, column, rule, rows[empty_ctx])
    return StepTokens(context=ctx_arr, action=act_arr, source=source, prefix_mismatch=mismatch)


def _check_ranges(log: Log, rows: np.ndarray, ctx: list, act: list, vocab_size: int | None) -> None:
    """Token ids outside the model's vocabulary: an error naming the column they came from
    (context ids first, then action ids)."""
    if vocab_size is None:
        return
    for column, ids in ((C.PROMPT_TOKEN_IDS, ctx), (C.ACTION_TOKEN_IDS, act)):
        bad = [i for i, x in enumerate(ids) if len(x) and (x.min() < 0 or x.max() >= vocab_size)]
        if bad:
            rule = f"token ids must lie in 0..{vocab_size - 1} (the model's vocabulary)"
            raise row_violation(log, column, rule, rows[np.array(bad)])


def check_positions(
    log: Log, rows: np.ndarray, lengths: np.ndarray, source: np.ndarray, limit: int | None, hint: str = ""
) -> None:
    """Refuse steps whose context + action (`lengths` tokens, from `source`, of the original
    `rows`) is longer than `limit` (models.position_limit): one error naming the rows, not an
    index error inside the model (a device-side assert on a GPU). `hint` ends the message."""
    if limit is None:
        return
    over = np.flatnonzero(np.asarray(lengths) > limit)
    if len(over):
        raise row_violation(
            log,
            CONTEXT_COLUMN[int(source[over[0]])],
            f"context + action is up to {int(np.max(lengths[over])):,} tokens, longer than the {limit:,} "
            f"positions of the model (learned position embeddings){hint}",
            rows[over],
        )

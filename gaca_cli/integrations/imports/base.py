"""What every `gaca import` format shares: its description, its options, its errors, and the
helpers that read JSONL and Parquet sources record by record and split whole chats into steps.

A format is one module beside this one that defines `INFO` (a `FormatInfo`) and
`read(files, options)`, a generator of one dict per gaca step row (see `docs/importing.md`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from gaca_cli.errors import GacaError
from gaca_cli.files import glob_matches
from gaca_cli.log import columns as C

File = str | os.PathLike  # a source file's path

#: the log's columns a format fills, and `extra`: a source field of one of these names that the
#: format does not map is kept as `source_<name>` (the core does the same for the columns the
#: commands write)
SCHEMA_COLUMNS = frozenset(
    {*C.REQUIRED, C.PROMPT, C.MESSAGES, C.ACTION, C.ANCHOR_OBS, C.ANCHOR_KEY, C.DONE, C.EPISODE_REWARD, "extra"}
    | {C.PROMPT_TOKEN_IDS, C.ACTION_TOKEN_IDS, C.BEHAVIOR_LOGPROBS}
)


@dataclass(frozen=True)
class FormatInfo:
    """What a format is, for `gaca import --list`, the summary and the docs' table."""

    name: str
    summary: str  # one line
    suffixes: tuple[str, ...]  # the files taken from a directory SRC
    carries: str
    lacks: str
    source: str  # the framework file(s) and version this importer follows
    mapped: Mapping[str, str] = field(default_factory=dict)  # gaca column -> source field
    derived: Mapping[str, str] = field(default_factory=dict)  # gaca column -> how it is derived
    companions: tuple[str, ...] = ()  # files read beside a source file (the output never replaces them)


@dataclass(frozen=True)
class ImportOptions:
    """The options of `gaca import` that formats read.

    `reward_weights`: the weights of a run's reward functions, in the source's column order
    (trl). `field_map`: gaca field -> the source's field name (`--map`, chat-jsonl)."""

    reward_weights: tuple[float, ...] | None = None
    field_map: Mapping[str, str] = field(default_factory=dict)


class SourceError(GacaError):
    """A source record that does not fit its format: file, line or row, field, rule."""

    def __init__(self, file: File, where: str | None, field: str | None, rule: str) -> None:
        parts = [p for p in (where, f"field '{field}'" if field else None) if p]
        super().__init__(": ".join([*parts, rule]), file=str(file))


class Located(dict):
    """A row that knows the source record it came from (`file`, and `where` in it: "line 3",
    "row 7"), so that what the import finds after the format has read the record (a field whose
    type changes from one record to the next, say) names the file and the line as well."""

    __slots__ = ("file", "where")

    file: File
    where: str | None


def locate(row: dict[str, Any], file: File, where: str | None) -> dict[str, Any]:
    """`row` as a `Located` row from `where` in `file`."""
    located = row if isinstance(row, Located) else Located(row)
    located.file, located.where = file, where
    return located


def located(rows: Iterable[dict[str, Any]], file: File, where: str | None) -> Iterator[dict[str, Any]]:
    """Each of `rows` (the rows of one source record) as a `Located` row."""
    return (locate(row, file, where) for row in rows)


def origin(row: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(file, where) of a `Located` row; (None, None) for another."""
    return (str(row.file), row.where) if isinstance(row, Located) else (None, None)


def is_scalar(value: Any) -> bool:
    """A value that becomes its own column (a string, number, boolean or null); anything else
    (lists, objects) goes into the JSON column `extra`."""
    return value is None or isinstance(value, (str, int, float, bool))


def split_fields(items: Iterable[tuple[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A source's other fields as (scalars for their own columns, nested values for `extra`)."""
    own: dict[str, Any] = {}
    nested: dict[str, Any] = {}
    for key, value in items:
        (own if is_scalar(value) else nested)[key] = value
    return own, nested


def keep_columns(
    own: Mapping[str, Any], file: File, where: str | None, written: Container[str], prefixes: tuple[str, ...] = ()
) -> dict[str, Any]:
    """A record's scalar fields for their own columns, under their names, except one named like
    a column the format writes (one of `written`, or starting with one of `prefixes`): that one
    is kept as `source_<name>`. A record that also has a field `source_<name>` of its own is a
    SourceError naming the field: the two cannot share the column, and neither is dropped."""

    def renamed(key: str) -> bool:
        return key in written or key.startswith(prefixes)

    kept: dict[str, Any] = {}
    for key, value in own.items():
        if not renamed(key):
            kept[key] = value
            continue
        name = f"source_{key}"
        if name in own and not renamed(name):
            rule = f"is kept as '{name}' because gaca writes a column '{key}', but the record also gives '{name}'"
            raise SourceError(file, where, key, rule + "; rename one of the two in the source")
        kept[name] = value
    return kept


def rest(
    items: Iterable[tuple[str, Any]], file: File, where: str | None, written: Container[str], prefixes: tuple = ()
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A record's other fields: (its scalars for their own columns, `keep_columns`; its nested
    values for `extra`)."""
    own, nested = split_fields(items)
    return keep_columns(own, file, where, written, prefixes), nested


def with_extra(row: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`row`, with `extra` as its `extra` column when there is any."""
    if extra:
        row["extra"] = extra
    return row


def mask_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of non-zero values in a loss or response mask."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def token_steps(
    prompt_ids: list[int], response_ids: list[int], runs: list[tuple[int, int]], logprobs: list[float] | None
) -> list[dict[str, Any]]:
    """The token columns of the steps of one response, a step per [start, end) run of its
    mask: the prompt and the response before the run as its context, the run as its action."""
    steps = []
    for start, end in runs:
        step: dict[str, Any] = {
            "prompt_token_ids": prompt_ids + response_ids[:start],
            "action_token_ids": response_ids[start:end],
        }
        if logprobs is not None:
            step["behavior_logprobs"] = logprobs[start:end]
        steps.append(step)
    return steps


def text_of(content: Any) -> str:
    """The text of a chat message's content: a string as it is, OpenAI content parts
    (`[{"type": "text", "text": ...}, ...]`) joined, None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            else:
                texts.append(json.dumps(part, sort_keys=True, default=str))
        return "".join(texts)
    return json.dumps(content, sort_keys=True, default=str)


def plain_chat(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Chat messages as the log's `messages` column holds them: `{"role", "content"}` text."""
    return [{"role": str(m.get("role", "")), "content": text_of(m.get("content"))} for m in messages]


def action_text(message: Mapping[str, Any]) -> str:
    """What an assistant turn produced: its text, followed by its tool calls as JSON when it
    made any (a turn with tool calls and no text is its tool calls)."""
    text = text_of(message.get("content"))
    calls = message.get("tool_calls")
    if calls:
        rendered = json.dumps(calls, sort_keys=True, default=str)
        text = f"{text}\n{rendered}" if text else rendered
    return text


def split_chat(
    messages: Sequence[Mapping[str, Any]], assistant_role: str = "assistant"
) -> Iterator[tuple[list[dict[str, str]], str, Mapping[str, Any]]]:
    """One step per assistant turn: (the chat before it as `{"role", "content"}` dicts, the
    turn's text (`action_text`), the turn's message as the source wrote it)."""
    context: list[dict[str, str]] = []
    for m in messages:
        turn = chat_turn(m, assistant_role)
        if m.get("role") == assistant_role:
            yield list(context), turn["content"], m
        context.append(turn)


def chat_turn(message: Mapping[str, Any], assistant_role: str = "assistant") -> dict[str, str]:
    """A message as the context of later turns holds it, `{"role", "content"}` text; an
    assistant turn's content is its `action_text` (its tool calls included)."""
    if message.get("role") == assistant_role:
        return {"role": str(message.get("role")), "content": action_text(message)}
    return plain_chat([message])[0]


def after_last_turn(messages: Sequence[Mapping[str, Any]], assistant_role: str = "assistant") -> str | None:
    """The messages after a chat's last assistant turn (the environment's final feedback, a
    user's closing turn, a last tool result) as the text of the `final_observation` column, one
    `role: content` line per message; None when the chat ends with an assistant turn."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == assistant_role), default=None)
    if last is None or last == len(messages) - 1:
        return None
    return "\n".join(f"{m.get('role')}: {text_of(m.get('content'))}" for m in messages[last + 1 :])


def message_fields(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The fields of a chat's messages besides role, content and tool_calls (`tool_call_id`,
    `name`, any other key), by position in the chat, for `extra.message_fields`."""
    fields = {}
    for i, m in enumerate(messages):
        rest = {k: v for k, v in m.items() if k not in ("role", "content", "tool_calls") and v is not None}
        if rest:
            fields[str(i)] = rest
    return fields


def _check_utf8(path: File, text: str, first_line: int = 1) -> None:
    """A SourceError for a line or document that is not UTF-8 text (read with
    `errors="surrogateescape"`, which keeps such a byte as a lone surrogate): its line, the
    first bad byte, and a hint when the file is Parquet (which the JSON formats do not read)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.start
        line = first_line + text.count("\n", 0, bad)
        column = bad - (text.rfind("\n", 0, bad) + 1) + 1
        byte = ord(text[bad]) - 0xDC00
        hint = " (a Parquet file: this format reads JSON)" if first_line == 1 and text.startswith("PAR1") else ""
        rule = f"not UTF-8 text (byte 0x{byte:02x} at column {column}){hint}"
        raise SourceError(path, f"line {line}", None, rule) from None


#: a JSON escape of a UTF-16 surrogate: paired ones decode to one character, a lone one does not
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_unicode(value: Any, text: str, path: File, where: str | None) -> Any:
    """`value` (parsed from `text`), or a SourceError naming the field with a lone surrogate
    escape (half of a UTF-16 pair, as from an emoji cut in two): no Parquet column can hold it."""
    if not _SURROGATE_ESCAPE.search(text):
        return value
    fields = value.items() if isinstance(value, Mapping) else [(None, value)]
    for key, item in fields:
        for part in (key, item):
            dumped = json.dumps(part, ensure_ascii=False)
            try:
                dumped.encode("utf-8")
            except UnicodeEncodeError as exc:
                name = key if part is item else None
                rule = f"not valid Unicode: a lone surrogate \\u{ord(dumped[exc.start]):04x} (half of a UTF-16 pair, e.g. a cut emoji)"
                raise SourceError(path, where, name, rule) from None
    return value


def _loads(text: str, path: File, where: str | None, key: str | None = None) -> Any:
    """`json.loads(text)` (the value of field `key`, when given); text that is not JSON, or has
    a string that is not valid Unicode, is a SourceError."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        line = where or f"line {exc.lineno}"
        raise SourceError(path, line, key, f"not valid JSON ({exc.msg})") from None
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise SourceError(path, where, key, f"not valid JSON ({str(exc).split(':')[0]})") from None
    except RecursionError:
        raise SourceError(path, where, key, "not valid JSON (nested too deeply to read)") from None
    return _check_unicode(value, text, path, where)


def json_text(value: Any, path: File, where: str | None, key: str) -> Any:
    """Field `key`, JSON stored as text (as ART's Parquet writer does), parsed; None for null or ""."""
    return None if value is None or value == "" else _loads(declared(str, value, path, where, key), path, where, key)


def iter_jsonl(path: File) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON value) for each non-blank line, read line by line. A line
    that is not UTF-8 text or not JSON is a SourceError naming it."""
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        for number, line in enumerate(fh, start=1):
            _check_utf8(path, line, number)
            if line.strip():
                yield number, _loads(line, path, f"line {number}")


def objects(path: File) -> Iterator[tuple[int, str, Mapping[str, Any]]]:
    """(line number, "line N", the object) for each line of a JSONL file (`iter_jsonl`); a line
    that is not a JSON object is a SourceError."""
    for number, record in iter_jsonl(path):
        where = f"line {number}"
        if not isinstance(record, Mapping):
            raise SourceError(path, where, None, f"expected a JSON object, got {type(record).__name__}")
        yield number, where, record


def read_json(path: File) -> Any:
    """A whole JSON document (for formats that write one small file per episode). A file that
    is not UTF-8 text or not JSON is a SourceError naming the line."""
    with open(path, encoding="utf-8", errors="surrogateescape") as fh:
        text = fh.read()
    _check_utf8(path, text)
    return _loads(text, path, None)


def iter_parquet_rows(
    path: File, columns: Sequence[str] | None = None, batch_rows: int = 4096
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(0-based row number, row as a dict) for each row of a Parquet file, read in record
    batches. A file that is not readable Parquet is a SourceError."""
    from gaca_cli.log.decoding import ENCRYPTED, encrypted
    from gaca_cli.log.reading import READ_ERRORS, open_parquet

    if encrypted(str(path)):  # before pyarrow, which aborts the process on an encrypted column
        raise SourceError(path, None, None, ENCRYPTED)
    try:
        pf = open_parquet(str(path))  # page checksums verified where the file has them
        row = 0
        for batch in pf.iter_batches(batch_size=batch_rows, columns=list(columns) if columns else None):
            try:
                records = batch.to_pylist()
            except UnicodeDecodeError:
                raise _bad_text(path, batch, row) from None
            for record in records:
                yield row, record
                row += 1
    except READ_ERRORS as exc:
        first = str(exc).strip().splitlines()
        reason = first[0] if first else type(exc).__name__
        raise SourceError(path, None, None, f"not a readable Parquet file ({reason})") from None


def _bad_text(path: File, batch: Any, first_row: int) -> SourceError:
    """The error for a record batch with a string that is not UTF-8: its first such value's
    row and column (found value by value, only when there is one)."""
    for name, column in zip(batch.schema.names, batch.columns):
        for i in range(len(column)):
            try:
                column[i].as_py()
            except UnicodeDecodeError:
                return SourceError(path, f"row {first_row + i}", name, "not UTF-8 text")
    return SourceError(path, None, None, "not UTF-8 text")


def file_labels(files: Sequence[Path]) -> dict[Path, str]:
    """Each file's path relative to the folder all the files share, without its suffix: short
    ids that stay unique when several runs' folders are imported together."""
    resolved = [f.resolve() for f in files]
    if not resolved:
        return {}
    common = Path(os.path.commonpath([r.parent for r in resolved]))
    return {f: r.relative_to(common).with_suffix("").as_posix() for f, r in zip(files, resolved, strict=True)}


def show(value: Any) -> str:
    """A source value as an error message quotes it: JSON, at most 40 characters."""
    return json.dumps(value, default=str)[:40]


#: how an error names the types a declaration expects (msgspec's names -> the user's words)
_KINDS = {"float": "a number", "int": "an integer", "str": "a string", "bool": "true or false"}
_KINDS.update(array="a list", object="an object")


def _kinds(names: str) -> str:
    return " or ".join(_KINDS.get(k, k) for k in names.split(" | ") if k != "null")


def broken(field: str, rule: str) -> ValueError:
    """What a declaration's own check (its `__post_init__`) raises: `rule` about `field`."""
    return ValueError(f"{field}\x1f{rule}")


_AT = re.compile(r"(.*?)(?: - at `\$(.*)`)?", re.S)
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


def _at(value: Any, path: str) -> Any:
    """The value at `path` (msgspec's `.key[0]` notation) in `value`, None where it is absent."""
    for key, index in _STEP.findall(path):
        if index == "...":
            return None
        if key:
            value = value.get(key) if isinstance(value, Mapping) else None
        else:
            value = value[int(index)] if isinstance(value, list) and int(index) < len(value) else None
    return value


def declared(kind: Any, value: Any, file: File, where: str | None, prefix: str = "") -> Any:
    """`value` (a parsed JSON record) as its declaration `kind`, a msgspec Struct or type (strict: no
    string for a number, no bool for an integer); a record that does not fit is a SourceError
    naming the field (`prefix` + its path in the record) and the rule it breaks. The one place
    that turns a declaration's complaint into the `Error:` line."""
    try:
        return msgspec.convert(value, kind, strict=True)
    except msgspec.ValidationError as exc:
        match = _AT.fullmatch(str(exc))
        message, path = (match[1], match[2] or "") if match else (str(exc), "")
        got = _at(value, path)
        if m := re.fullmatch(r"Object missing required field `(.+)`", message):
            path, rule = f"{path}.{m[1]}", "missing"
        elif m := re.fullmatch(r"Expected `(.+?)`, got `(.+?)`", message):
            if not path and m[1] == "object":
                rule = f"expected a JSON object, got {type(value).__name__}"
            else:
                rule = f"must be {_kinds(m[1])}, got {show(got)}"
        elif "\x1f" in message:  # a rule the declaration states itself (broken(field, rule))
            name, rule = message.split("\x1f", 1)
            path = f"{path}.{name}"
        elif message == "Number out of range" and isinstance(got, int):
            rule = f"is an integer of {len(str(abs(got)))} digits, too large for a number"
        else:
            rule = message
        field = (prefix + path.replace("[...]", "")).lstrip(".") or None
        raise SourceError(file, where, field, rule) from None


CHAT = "a list of chat messages ({'role': ..., 'content': ...})"


def chat_messages(value: Any, file: File, where: str | None, key: str, rule: str = "") -> list[Any]:
    """`value`, which must be a list of chat messages (objects with a string `role`)."""
    if not isinstance(value, list) or not all(isinstance(m, Mapping) and isinstance(m.get("role"), str) for m in value):
        raise SourceError(file, where, key, rule or f"must be {CHAT}, each role a string")
    return value


def number(value: Any, file: File, where: str | None, key: str) -> float:
    """A float from a JSON number (bool refused; an integer beyond a float's range, ~1.8e308,
    is a SourceError too)."""
    return declared(float, value, file, where, key)


def _matches(text: str) -> list[str]:
    """A source as given: a glob's matches (sorted), else the path itself."""
    matches = glob_matches(text)
    return [text] if matches is None else matches


def companion_files(sources: Iterable[File], companions: Sequence[str]) -> list[Path]:
    """The existing files named `companions` beside each source file (globs expanded), which a
    format reads along with it (ms-swift's args.json, verifiers' metadata.json)."""
    return [
        p
        for raw in sources
        for m in _matches(str(raw))
        if os.path.isfile(m)
        for name in companions
        if (p := Path(m).parent / name).is_file()
    ]


def expand_sources(sources: Iterable[File], suffixes: Sequence[str]) -> list[Path]:
    """Files, globs and directories (searched recursively for `suffixes`) to a sorted list of
    files, each once."""
    files: list[Path] = []
    for raw in sources:
        matches = _matches(str(raw))
        if not matches:
            raise GacaError("no file matches this pattern", file=str(raw))
        for m in matches:
            p = Path(m)
            if p.is_dir():
                found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(tuple(suffixes)))
                if not found:
                    raise GacaError(f"no {' or '.join(suffixes)} file in this directory", file=m)
                files.extend(found)
            elif p.exists():
                files.append(p)
            else:
                raise GacaError("no such file or directory", file=m)
    unique: dict[Path, Path] = {}
    for f in files:
        unique.setdefault(f.resolve(), f)
    return list(unique.values())

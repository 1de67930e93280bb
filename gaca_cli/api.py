"""The library API (`import gaca_cli as gaca`; docs/python-api.md): each command as a function,
its options those of the command's config dataclass, its data errors GacaError. The commands
in `gaca_cli.cli` call these functions."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from gaca_cli.config import options_config
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.credit.run import AdvantagesRun, gc_paused
from gaca_cli.credit.run import compute_advantages as run_estimator
from gaca_cli.errors import GacaError
from gaca_cli.integrations.arrays import compute_advantages as compute_advantages
from gaca_cli.log import columns as C
from gaca_cli.log.reading import Log, memory_log

#: how an in-memory input is named in errors (GacaError.file)
TABLE_NAMES = {"arrow": "<pyarrow.Table>", "polars": "<polars.DataFrame>", "pandas": "<pandas.DataFrame>"}


def _kind(data: Any) -> str:
    """ "arrow", "polars", "pandas" or "paths"."""
    if isinstance(data, pa.Table):
        return "arrow"
    module = type(data).__module__.split(".")[0]
    if module in ("polars", "pandas") and type(data).__name__ == "DataFrame":
        return module
    if isinstance(data, (str, os.PathLike)) or (
        isinstance(data, Sequence) and data and all(isinstance(p, (str, os.PathLike)) for p in data)
    ):
        return "paths"
    raise TypeError(f"expected a pyarrow Table, a polars or pandas DataFrame, or paths; got {type(data).__name__}")


def _paths(data: Any) -> list[str | os.PathLike]:
    return [data] if isinstance(data, (str, os.PathLike)) else list(data)


def _arrow(data: Any, kind: str) -> pa.Table:
    if kind == "polars":
        import polars as pl

        return data.to_arrow(compat_level=pl.CompatLevel.oldest())
    if kind == "pandas":
        return pa.Table.from_pandas(data, preserve_index=False)
    return data


def _log(data: Any, kind: str, column_map: Mapping[str, str] | None) -> Log:
    from gaca_cli.log.reading import read_log as read

    if kind == "paths":
        return read(_paths(data), column_map)
    return memory_log(_arrow(data, kind), column_map, TABLE_NAMES[kind])


def read_log(paths: str | os.PathLike | Sequence[str | os.PathLike], column_map: Mapping[str, str] | None = None):
    """The log in Parquet files, globs or directories as one pyarrow Table, columns under gaca's
    names (`column_map`: {gaca's name: the files' name}); page checksums verified."""
    return _log(paths, "paths", column_map).table


def run_advantages(
    data: Any, kind: str, config: AdvantagesConfig, column_map: Mapping[str, str] | None
) -> AdvantagesRun:
    """The run of `advantages` (and of `gaca advantages`, which writes it)."""
    from gaca_cli.credit.reading import read_for_advantages

    with gc_paused():
        paths = kind == "paths"
        log = (
            read_for_advantages(_paths(data), dict(column_map or {}), config) if paths else _log(data, kind, column_map)
        )
        return run_estimator(log, config)


def advantages(data: Any, *, method: str, column_map: Mapping[str, str] | None = None, **options: Any) -> Any:
    """`gaca advantages` on `data`: a pyarrow Table, a polars or pandas DataFrame, or Parquet
    paths (files, globs, directories). Returns the same kind (a pyarrow Table for paths): every
    input column plus the method's columns (those of an earlier run replaced), rows in the
    input's order, the numbers bit for bit those `gaca advantages` writes. `options` are the
    command's (`gamma=0.95`, `beta=0.3`, `nll_reduce="sum"`, ...)."""
    config = options_config(AdvantagesConfig, options, method=method)
    kind = _kind(data)
    run = run_advantages(data, kind, config, column_map)
    if kind == "paths":
        return annotated(run, _paths(data), column_map)
    if kind == "arrow":
        meta = {**(data.schema.metadata or {}), **{k.encode(): v.encode() for k, v in run.metadata.items()}}
        return run.table.replace_schema_metadata(meta)
    owned = [run.log.original_name(n) for n in run.log.table.column_names if n in C.ADVANTAGES_OUTPUTS]
    if kind == "polars":
        return data.drop(owned).hstack(_polars(run.new_columns).get_columns())
    out = data.drop(columns=owned)
    for name, column in zip(run.new_columns.column_names, run.new_columns.columns):
        out[name] = column.to_numpy(zero_copy_only=False)
    return out


def annotated(run: AdvantagesRun, paths: Sequence[str | os.PathLike], column_map: Mapping[str, str] | None) -> pa.Table:
    """The table `gaca advantages` writes for a run on files: every column of the files."""
    from gaca_cli.credit.writing import output_metadata, whole_annotated

    full, table = whole_annotated(run, paths, column_map)
    return table.replace_schema_metadata(output_metadata(full, run.metadata))


def validate(data: Any, *, command: str = "validate", column_map: Mapping[str, str] | None = None) -> list[GacaError]:
    """Every broken rule of the log schema in `data` (a table, DataFrame or paths), as the
    GacaErrors `gaca validate` prints (`file`, `column`, `rule`, `rows`, `n_rows`); empty when
    the log is clean. `command` also checks what a command needs ("advantages:gaca", "score")."""
    return check(data, command, column_map)[1].violations


def check(data: Any, command: str, column_map: Mapping[str, str] | None):
    """(the log, its CheckReport): what `validate` and `gaca validate` report."""
    from gaca_cli.log.checks import check_log

    _check_command(command)
    log = _log(data, _kind(data), column_map)
    return log, check_log(log, command)


def _check_command(command: str) -> None:
    """A ValueError for a command whose needs the checks do not know (COMMAND_NEEDS)."""
    from gaca_cli.log.schema import COMMAND_NEEDS

    if command not in COMMAND_NEEDS:
        raise ValueError(f"command={command!r} is not valid; use one of {', '.join(COMMAND_NEEDS)}")


def import_logs(
    format: str,
    sources: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    output: str | os.PathLike | None = None,
    command: str = "validate",
    reward_weights: Sequence[float] | None = None,
    field_map: Mapping[str, str] | None = None,
) -> pa.Table:
    """`gaca import --from FORMAT`: a framework's rollout logs as a checked gaca log (a pyarrow
    Table), also written to `output` when given (atomically; nothing is written when a record
    does not fit the format or the log breaks a rule: the GacaError is raised)."""
    import pyarrow.parquet as pq

    from gaca_cli.integrations.imports.base import ImportOptions

    weights = None if reward_weights is None else tuple(reward_weights)
    options = ImportOptions(reward_weights=weights, field_map=dict(field_map or {}))
    with tempfile.TemporaryDirectory(prefix="gaca-import-") as tmp:
        out = Path(output) if output is not None else Path(tmp) / "log.parquet"
        run_import(format, sources, out, options, command)
        return pq.read_table(out)


def run_import(format_name: str, sources: Any, out: Path | None, options: Any, command: str = "validate") -> Any:
    """The run of `import_logs` and `gaca import` (the first broken rule raised, nothing written), and of
    `gaca validate --from` (`out` None: only checked, every broken rule in the result's `violations`)."""
    from gaca_cli.integrations.imports.core import run_import as run

    _check_command(command)
    result = run(format_name, _paths(sources), out, options, command)
    if out is not None and result.violations:
        raise result.violations[0]
    return result


def score(
    data: Any, *, model: Any, tokenizer: Any = None, column_map: Mapping[str, str] | None = None, **options: Any
) -> Any:
    """`gaca score`: the NLL of every logged action (nll_sum, nll_mean, n_action_tokens) under
    `model`, a local directory or hub id, or a transformers causal LM already loaded, with its
    `tokenizer`. Returns `data`'s kind (a pyarrow Table for paths) with the score columns.
    `options` are the command's (`temperature`, `context`, `max_batch_tokens`, ...; with a
    loaded model, not those that load one: dtype, device, revision, trust_remote_code)."""
    from gaca_cli.lm.score_config import ScoreConfig

    loaded, name = None, str(model)
    if not isinstance(model, (str, os.PathLike)):
        loading = sorted({"dtype", "device", "revision", "trust_remote_code"} & set(options))
        if tokenizer is None or loading:
            raise TypeError(f"a loaded model is given with its tokenizer=, without options that load one {loading}")
        loaded = (model, tokenizer, next(model.parameters()).device, next(model.parameters()).dtype)
        name = getattr(model, "name_or_path", "") or type(model).__name__
    config = options_config(ScoreConfig, options, model=name)
    kind = _kind(data)
    with tempfile.TemporaryDirectory(prefix="gaca-score-") as tmp:
        run = run_score(_log(data, kind, column_map), config, Path(tmp) / "scored.parquet", loaded=loaded)
    table = run.table.replace_schema_metadata({k.encode(): v.encode() for k, v in run.metadata.items()})
    return table if kind in ("paths", "arrow") else table.to_pandas() if kind == "pandas" else _polars(table)


def run_score(log: Log, config: Any, out: Path, *, loaded: tuple | None = None, **shard: Any) -> Any:
    """The run of `score` and `gaca score` (which gives its rank, world, barrier, agree and progress in `shard`):
    `log` scored into `out`, a `loaded` (model, tokenizer, device, dtype) in eval mode, then left as it was."""
    from gaca_cli.lm.scoring import run_score as run

    training = loaded is not None and loaded[0].training
    try:
        if loaded is not None:
            loaded[0].eval()
        return run(log, config, out, loaded=loaded, **shard)
    finally:
        if training:
            loaded[0].train()  # type: ignore[index]


def _polars(table: pa.Table) -> Any:
    import polars as pl

    return pl.from_arrow(table)

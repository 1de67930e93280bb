"""Writing files safely: atomic writes through a temporary file and a rename, scratch
directories beside the output, the clean-up of temporaries a killed run left, and the checks
of an output path before any work. Standard library only: every layer writes through it."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from gaca_cli.errors import GacaError

GLOB_CHARS = set("*?[")  # a LOG argument with one of these is a pattern


def glob_matches(text: str) -> list[str] | None:
    """The paths a pattern matches, sorted (`**` spans folders); None when `text` is a path
    (no glob character, or a file or folder of that very name exists)."""
    if not any(ch in GLOB_CHARS for ch in text) or os.path.exists(text):
        return None
    return sorted(glob.glob(text, recursive=True))


@contextlib.contextmanager
def atomic_path(out: str | os.PathLike) -> Iterator[str]:
    """A temporary path in the directory of `out`; renamed to `out` when the block succeeds,
    deleted when it fails, so `out` either keeps its old content or holds the complete file.

    The temporary file is named `.OUT.PID.XXXXXXXX.tmp` after the process writing it, so
    that a temporary file left by a process that died without cleaning up (kill -9, power
    loss, a Ctrl-C in the instant it was created) is removed by the next run writing the same
    `out` (`remove_stale_temporaries`); one whose process still runs is left alone."""
    out = Path(out)
    if out.exists() and not out.is_file():  # a directory, a device (/dev/null), a pipe: never replaced
        raise GacaError(f"{out} exists and is not a regular file, so it is not replaced")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(out)
    except OSError as exc:
        raise GacaError(f"cannot write {out}: {exc.strerror or exc}") from None
    tmp = None
    try:
        try:
            fd, tmp = tempfile.mkstemp(prefix=f"{_temporary_prefix(out)}{os.getpid()}.", suffix=".tmp", dir=out.parent)
        except OSError as exc:
            raise GacaError(f"cannot write {out}: {exc.strerror or exc}") from None
        os.close(fd)
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600 files; give the usual mode
        os.replace(tmp, out)
    except BaseException:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        raise


def temporary_dir(out: str | os.PathLike) -> Path:
    """A scratch directory beside `out`, named as `atomic_path` names its temporary files
    (`.OUT.PID.XXXXXXXX.tmp`), so that one left by a killed run is removed by the next run
    writing `out`. The caller removes it."""
    out = Path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(out)
        return Path(tempfile.mkdtemp(prefix=f"{_temporary_prefix(out)}{os.getpid()}.", suffix=".tmp", dir=out.parent))
    except OSError as exc:
        raise GacaError(f"cannot write {out}: {exc.strerror or exc}") from None


def missing_dirs(path: str | os.PathLike) -> list[Path]:
    """The folders on the way to `path` (itself included) that do not exist yet, deepest
    first: what a run that creates them and then fails removes again (`remove_empty`)."""
    missing = []
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def remove_empty(dirs: Sequence[Path]) -> None:
    """Remove the folders `dirs` (deepest first) while they are empty."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            return


def discard_dir(path: str | os.PathLike, out: str | os.PathLike) -> None:
    """Remove the directory `path` (a work directory beside `out`) so that a kill midway
    leaves nothing half-removed under its name: it is renamed at once to a temporary name of
    `out` (`.OUT.PID.XXXXXXXX.tmp`), which the next run writing `out` removes if this one
    dies while deleting it."""
    path, out = Path(path), Path(out)
    if not path.exists():
        return
    doomed = out.parent / f"{_temporary_prefix(out)}{os.getpid()}.{secrets.token_hex(4)}.tmp"
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


#: PID.XXXXXXXX between `.OUT.` and `.tmp` (mkstemp's 8 random characters)
_TEMPORARY_MIDDLE = re.compile(r"(\d+)\.[a-z0-9_]{8}")


def _temporary_prefix(out: Path) -> str:
    return f".{out.name}."


def remove_stale_temporaries(out: str | os.PathLike) -> list[str]:
    """Remove the temporary files `atomic_path` and directories `temporary_dir` made for `out`
    whose writing process has ended (named `.OUT.PID.XXXXXXXX.tmp`); return their paths.
    Those of running processes and files named otherwise are kept."""
    out = Path(out)
    prefix = _temporary_prefix(out)
    removed: list[str] = []
    try:
        names = os.listdir(out.parent)
    except OSError:
        return removed
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".tmp")):
            continue
        match = _TEMPORARY_MIDDLE.fullmatch(name[len(prefix) : -len(".tmp")])
        if match is None or _process_alive(int(match.group(1))):
            continue
        path = out.parent / name
        with contextlib.suppress(FileNotFoundError):  # another run removed it first
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(str(path))
    return removed


def _process_alive(pid: int) -> bool:
    """Whether a process with this id exists (on this machine; one that reuses a dead
    writer's id keeps that writer's temporary file, which is the safe side)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it exists, owned by someone else
        pass
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def same_or_inside(out: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> str | None:
    """The input that `out` would overwrite or fall inside of, if any."""
    out_path = Path(out).resolve()
    for raw in inputs:
        text = str(raw)
        candidates = glob.glob(text) if any(ch in GLOB_CHARS for ch in text) else [text]
        for cand in candidates:
            p = Path(cand).resolve()
            if out_path == p or (p.is_dir() and p in out_path.parents):
                return cand
    return None


def unwritable_reason(out: str | os.PathLike, directory: bool = False) -> str | None:
    """Why `out` (a file, or with `directory` a directory) cannot be written, checked before
    any work: it names an existing directory (or file), something on its path is a regular
    file, or the nearest existing folder is not writable. None when it can be written."""
    path = Path(out).absolute()
    if path.exists():
        if directory and not path.is_dir():
            return f"{out} is a file, not a directory"
        if not directory and path.is_dir():
            return f"{out} is a directory, not a file"
        if not directory and not path.is_file():
            return f"{out} is not a regular file (a device or a pipe is never replaced)"
    ancestor = path if (directory and path.is_dir()) else path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"{ancestor} is a file, so nothing can be created under it"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"{ancestor} is not writable"
    return None

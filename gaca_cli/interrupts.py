"""Ctrl-C: remembered when it arrives (`remember_ctrl_c`), told apart from the other errors
(`is_interruption`), masked where an interruption could only leave a clean-up half done
(`ctrl_c_ignored`, `ignore_ctrl_c`), and reported as one line saying what is kept, exit
status 130 (`report_interruption`). Standard library only: the library masks, the command
line reports."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import NoReturn

NOTHING_WRITTEN = "nothing was written"  # what a command that stopped before writing keeps
_ctrl_c_seen = False
_ctrl_c_reported = False


def report_interruption(kept: str | None) -> NoReturn:
    """Ctrl-C: one line saying what is kept (None: another process says it), exit status 130
    (a SystemExit, which no `except Exception` of the command's takes for an error)."""
    global _ctrl_c_reported
    if kept is not None:
        print(f"interrupted; {kept}", file=sys.stderr, flush=True)
    _ctrl_c_reported = True
    raise SystemExit(130)


def unreported_ctrl_c() -> bool:
    """A Ctrl-C arrived and no line said so (it landed before or after a command's own
    handling: typer exits 130 silently, or the Ctrl-C escaped it)."""
    return _ctrl_c_seen and not _ctrl_c_reported


def remember_ctrl_c() -> None:
    """From here on a Ctrl-C is remembered as well as raised. Libraries can swallow the
    KeyboardInterrupt: one that lands in llvmlite's ctypes callback while numba compiles or
    loads a kernel is printed as "Exception ignored" and dropped, and numba then fails with an
    error of its own ("no compiled object yet"). So an exception after a Ctrl-C counts as the
    interruption (`is_interruption`), and the dropped KeyboardInterrupt is not printed. A process
    started with Ctrl-C ignored (a shell's background job) keeps ignoring it."""
    import signal

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def on_ctrl_c(signum, frame):
        global _ctrl_c_seen
        _ctrl_c_seen = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_ctrl_c)
    print_unraisable = sys.unraisablehook

    def unraisable(info) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            print_unraisable(info)

    sys.unraisablehook = unraisable


def is_interruption(exc: BaseException) -> bool:
    """A Ctrl-C, or an error it caused: one that lands while numba loads a compiled kernel
    comes out as a SystemError raised from the KeyboardInterrupt, and after one that a
    library swallowed (see `remember_ctrl_c`) any error counts. Not the exits a command
    raises on purpose: a SystemExit, or one of click's or typer's (typer.Exit, usage errors),
    told by their module so that this module needs neither."""
    if isinstance(exc, SystemExit) or type(exc).__module__.partition(".")[0] in ("click", "typer"):
        return False
    if _ctrl_c_seen:
        return True
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


@contextlib.contextmanager
def ctrl_c_ignored() -> Iterator[None]:
    """Ctrl-C is ignored inside the block (in the main thread; elsewhere it cannot arrive):
    for the clean-up after the output is complete, which an interruption could only leave
    half done, and whose command has succeeded."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def ignore_ctrl_c() -> None:
    """The command has finished (its output in place, or its error reported): a Ctrl-C while
    the interpreter shuts down (torch's and pyarrow's finalizers can take a moment) would
    only print a KeyboardInterrupt traceback from their code, so it is ignored from here on."""
    import signal

    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to do
        pass

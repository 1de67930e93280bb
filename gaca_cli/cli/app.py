"""The typer application that every command module registers on."""

import typer

app = typer.Typer(
    name="gaca",
    help=(
        "Offline credit assignment on logged LLM-agent rollouts: per-step NLL (score), "
        "GRPO / GiGPO / GACA advantages, offline policy updates and a terminal inspector.\n\n"
        "Exit status: 0 success, 1 a data or model error (one `Error:` line), 2 a usage error, "
        "3 a bug (with its traceback), 130 interrupted (Ctrl-C; nothing half-written)."
    ),
    no_args_is_help=True,
    rich_markup_mode=None,
    add_completion=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

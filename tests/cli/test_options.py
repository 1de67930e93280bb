"""Options made from config dataclasses (gaca_cli/cli/options.py): every option of a command is
its config field's flag, default and help; every invalid value is a usage error (exit 2) that
names the flag, quotes the value and says what to use instead."""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Literal

import pytest
import typer
from typer.testing import CliRunner

from gaca_cli.cli import app
from gaca_cli.cli.options import ConfigOptions, config_options, flag_of, option_fields
from gaca_cli.config import ConfigError, check_choices, choices_of
from gaca_cli.credit.config import AdvantagesConfig
from gaca_cli.demo.run import DemoConfig
from gaca_cli.inspect.config import InspectConfig
from gaca_cli.lm.score_config import ScoreConfig
from gaca_cli.lm.train_config import TrainConfig

runner = CliRunner()
CONFIGS = {
    "advantages": AdvantagesConfig,
    "score": ScoreConfig,
    "train-offline": TrainConfig,
    "inspect": InspectConfig,
    "demo": DemoConfig,
}
# the arguments a command needs besides the option under test (nothing is read: the config is
# built, and refused, before any file is opened)
BASE = {
    "advantages": ["missing.parquet", "-o", "out.parquet"],
    "score": ["missing.parquet", "--model", "m", "-o", "out.parquet"],
    "train-offline": ["missing.parquet", "--model", "m", "-o", "out"],
    "inspect": ["missing.parquet"],
    "demo": ["-o", "out"],
}


def click_params(command: str) -> dict:
    return {p.name: p for p in typer.main.get_command(app).commands[command].params}


@pytest.mark.parametrize("command", CONFIGS)
def test_every_option_field_is_an_option_with_its_flag_default_and_help(command):
    params = click_params(command)
    fields = option_fields(CONFIGS[command])
    assert fields, command
    for f in fields:
        param = params[f.name]
        assert flag_of(f) in param.opts, (command, f.name, param.opts)
        assert param.help == f.metadata["help"]
        if f.default is dataclasses.MISSING:
            assert param.required
        elif isinstance(f.default, tuple):
            assert param.default == (",".join(f.default) or None)
        else:
            assert param.default == f.default, (command, f.name)
        if f.default is True:
            assert f"--no-{flag_of(f)[2:]}" in param.secondary_opts


@pytest.mark.parametrize("command", CONFIGS)
def test_fields_without_help_are_not_options(command):
    params = click_params(command)
    hidden = [f.name for f in dataclasses.fields(CONFIGS[command]) if "help" not in f.metadata]
    assert not [name for name in hidden if name in params]


def test_existing_flags_and_short_names_are_kept():
    """The option names users already type (one sample per kind of field)."""
    opts = {name: set(p.opts) | set(p.secondary_opts) for name, p in click_params("advantages").items()}
    assert {"-m", "--method"} <= opts["method"] and "--step-weight" in opts["step_weight"]
    opts = {name: set(p.opts) | set(p.secondary_opts) for name, p in click_params("score").items()}
    assert {"-M", "--model"} <= opts["model"] and {"-T", "--temperature"} <= opts["temperature"]
    assert {"--pack", "--no-pack"} <= opts["pack"] and opts["token_logprobs"] == {"--token-logprobs"}
    opts = {name: set(p.opts) | set(p.secondary_opts) for name, p in click_params("train-offline").items()}
    assert {"--lora-targets", "--resume", "-o", "--output"} <= set().union(*opts.values())
    opts = {name: set(p.opts) | set(p.secondary_opts) for name, p in click_params("inspect").items()}
    assert opts["compare"] == {"--compare"} and click_params("inspect")["top"].metavar == "K"


def test_the_methods_offered_are_the_estimators():
    """The --method choices (and inspect's --compare, demo's --methods) come from config.METHODS,
    which must be the estimator registry's names."""
    from gaca_cli.credit.config import METHODS
    from gaca_cli.credit.estimators import ESTIMATORS

    assert METHODS == tuple(ESTIMATORS)


def test_a_literal_field_is_a_choice_that_help_and_completion_list():
    params = click_params("advantages")
    text = " ".join(runner.invoke(app, ["advantages", "--help"]).stdout.split())
    assert "-m, --method <grpo|gigpo|gaca|hgpo>" in text and "--nll-scope <trajectory|group|batch>" in text
    ctx = typer.main.get_command(app).commands["advantages"].make_context("advantages", ["x"], resilient_parsing=True)
    assert [c.value for c in params["nll_scope"].shell_complete(ctx, "")] == ["trajectory", "group", "batch"]
    assert [c.value for c in params["method"].shell_complete(ctx, "gi")] == ["gigpo"]
    assert "[default: (std (grpo, hgpo), mean (gigpo, gaca))]" in text  # metadata default_text


@pytest.mark.parametrize("command", CONFIGS)
def test_library_callers_get_the_choice_check_naming_the_field(command):
    """A config built in Python (not from the command line) refuses a value outside a Literal
    field's choices with a ConfigError that names the field and lists the choices."""
    cls = CONFIGS[command]
    hints = typing.get_type_hints(cls)
    required = {f.name: "m" for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    if command == "demo":
        required = {"out": "out"}
    literal = [f.name for f in dataclasses.fields(cls) if choices_of(hints[f.name])]
    assert literal, command
    for name in literal:
        bad = ("nope",) if typing.get_origin(hints[name]) is tuple else "nope"
        with pytest.raises(
            ConfigError, match=f"^{name} = 'nope' is not valid; use .*{choices_of(hints[name])[-1]}"
        ) as exc:
            cls(**required, **{name: bad})
        assert exc.value.field == name


def test_choices_written_elsewhere_agree():
    """The choices that the models code or the log's columns also spell out."""
    from gaca_cli.lm.models import DTYPES
    from gaca_cli.log import columns as C

    hints = typing.get_type_hints(TrainConfig)
    assert choices_of(typing.get_type_hints(ScoreConfig)["dtype"]) == DTYPES
    assert set(choices_of(hints["dtype"])) < set(DTYPES)
    assert choices_of(hints["behavior"]) == ("auto", C.BEHAVIOR_LOGPROBS, C.TOKEN_LOGPROBS)


def test_validate_for_lists_every_command_the_schema_knows():
    from gaca_cli.log.schema import COMMAND_NEEDS

    param = click_params("validate")["command"]
    listed = re.findall(r"[a-z][a-z:-]+[a-z]", param.help.split(":", 1)[1])
    assert [param.default, *listed] == list(COMMAND_NEEDS)


# --------------------------------------------------------------------------- invalid values

# (command, arguments, the flag the error must name, the bad value it must quote)
INVALID = [
    ("advantages", ["--method", "foo"], "--method", "foo"),
    ("advantages", ["--gamma", "2"], "--gamma", "2"),
    ("advantages", ["--gamma", "abc"], "--gamma", "abc"),
    ("advantages", ["--norm", "l2"], "--norm", "l2"),
    ("advantages", ["--step-weight", "-0.5"], "--step-weight", "-0.5"),
    ("advantages", ["--episode-stats", "all"], "--episode-stats", "all"),
    ("advantages", ["--anchor-similarity", "1.5"], "--anchor-similarity", "1.5"),
    ("advantages", ["--similarity-metric", "jaro"], "--similarity-metric", "jaro"),
    ("advantages", ["--similarity-order", "random"], "--similarity-order", "random"),
    ("advantages", ["--singleton-groups", "drop"], "--singleton-groups", "drop"),
    ("advantages", ["--epsilon", "-1e-6"], "--epsilon", "-1e-06"),
    ("advantages", ["--epsilon", "inf"], "--epsilon", "inf"),
    ("advantages", ["--beta", "-1"], "--beta", "-1"),
    ("advantages", ["--beta", "nan"], "--beta", "nan"),
    # options that act only with another's value: refused when given without it
    ("advantages", ["-m", "grpo", "--beta", "0.5"], "--beta", "0.5"),
    ("advantages", ["-m", "gigpo", "--nll-reduce", "sum"], "--nll-reduce", "sum"),
    ("advantages", ["-m", "gigpo", "--nll-scope", "group"], "--nll-scope", "group"),
    ("advantages", ["-m", "grpo", "--lambda-max", "0.9"], "--lambda-max", "0.9"),
    ("advantages", ["-m", "grpo", "--step-weight", "2"], "--step-weight", "2"),
    ("advantages", ["-m", "grpo", "--anchor-similarity", "0.9"], "--anchor-similarity", "0.9"),
    ("advantages", ["--similarity-metric", "difflib"], "--similarity-metric", "difflib"),
    ("advantages", ["--similarity-order", "rows"], "--similarity-order", "rows"),
    ("advantages", ["--nll-scope", "episode"], "--nll-scope", "episode"),
    ("advantages", ["--nll-reduce", "max"], "--nll-reduce", "max"),
    ("advantages", ["--lambda-min", "-0.1"], "--lambda-min", "-0.1"),
    ("advantages", ["--lambda-max", "2"], "--lambda-max", "2"),
    ("advantages", ["--lambda-max", "-1"], "--lambda-max", "-1"),
    ("advantages", ["--lambda-max", "0.3"], "--lambda-max", "0.3"),  # below λ̄ = 0.5
    ("advantages", ["--lambda-min", "0.7"], "--lambda-min", "0.7"),  # above λ̄
    ("advantages", ["--lambda-min", "0.6", "--lambda-max", "0.4"], "--lambda-max", "0.4"),
    ("advantages", ["-m", "hgpo", "--history-length", "-1"], "--history-length", "-1"),
    ("advantages", ["-m", "hgpo", "--history-length", "1.5"], "--history-length", "1.5"),
    ("advantages", ["-m", "hgpo", "--length-weight-alpha", "nan"], "--length-weight-alpha", "nan"),
    ("advantages", ["-m", "hgpo", "--length-weight-alpha", "1000"], "--length-weight-alpha", "1000"),
    ("advantages", ["-m", "gigpo", "--history-length", "3"], "--history-length", "3"),
    ("advantages", ["-m", "gaca", "--length-weight-alpha", "2"], "--length-weight-alpha", "2"),
    ("advantages", ["-m", "grpo", "--base-group"], "--base-group", "True"),
    ("advantages", ["-m", "hgpo", "--step-weight", "2"], "--step-weight", "2"),
    ("score", ["--model", ""], "--model", "''"),
    ("score", ["--dtype", "f8"], "--dtype", "f8"),
    ("score", ["--device", "gpu"], "--device", "gpu"),
    ("score", ["-T", "0"], "--temperature", "0"),
    ("score", ["--temperature", "hot"], "--temperature", "hot"),
    ("score", ["--context", "history"], "--context", "history"),
    ("score", ["--max-batch-tokens", "0"], "--max-batch-tokens", "0"),
    ("score", ["--max-batch-tokens", "1.5"], "--max-batch-tokens", "1.5"),
    ("score", ["--chunk-rows", "0"], "--chunk-rows", "0"),
    ("train-offline", ["--model", ""], "--model", "''"),
    ("train-offline", ["--loss", "dpo"], "--loss", "dpo"),
    ("train-offline", ["--aggregation", "sum"], "--aggregation", "sum"),
    ("train-offline", ["--clip-low", "1"], "--clip-low", "1"),
    ("train-offline", ["--clip-high", "-1"], "--clip-high", "-1"),
    ("train-offline", ["--loss", "pg", "--is-cap", "0"], "--is-cap", "0"),
    ("train-offline", ["--is-cap", "2"], "--is-cap", "2"),  # only with --loss pg
    ("train-offline", ["--awr-temperature", "0"], "--awr-temperature", "0"),
    ("train-offline", ["--awr-temperature", "2"], "--awr-temperature", "2"),  # only with --loss awr
    ("train-offline", ["--loss", "pg", "--awr-max-weight", "5"], "--awr-max-weight", "5"),
    ("train-offline", ["--loss", "awr", "--clip-low", "0.1"], "--clip-low", "0.1"),  # only with ppo
    ("train-offline", ["--loss", "pg", "--clip-high", "0.3"], "--clip-high", "0.3"),
    ("train-offline", ["--bc-threshold", "1"], "--bc-threshold", "1"),  # only with filtered-bc
    ("train-offline", ["--lora-alpha", "8"], "--lora-alpha", "8"),  # only with LoRA
    ("train-offline", ["--lora-targets", "q_proj"], "--lora-targets", "q_proj"),
    ("train-offline", ["--awr-max-weight", "0"], "--awr-max-weight", "0"),
    ("train-offline", ["--bc-threshold", "inf"], "--bc-threshold", "inf"),
    ("train-offline", ["--kl-coef", "-1"], "--kl-coef", "-1"),
    ("train-offline", ["--behavior", "mu"], "--behavior", "mu"),
    ("train-offline", ["-T", "0"], "--temperature", "0"),
    ("train-offline", ["--context", "history"], "--context", "history"),
    ("train-offline", ["--lr", "-1"], "--lr", "-1"),
    ("train-offline", ["--weight-decay", "-1"], "--weight-decay", "-1"),
    ("train-offline", ["--warmup-ratio", "1"], "--warmup-ratio", "1"),
    ("train-offline", ["--min-lr-ratio", "2"], "--min-lr-ratio", "2"),
    ("train-offline", ["--max-grad-norm", "-1"], "--max-grad-norm", "-1"),
    ("train-offline", ["--batch-size", "0"], "--batch-size", "0"),
    ("train-offline", ["--max-batch-tokens", "1"], "--max-batch-tokens", "1"),
    ("train-offline", ["--epochs", "0"], "--epochs", "0"),
    ("train-offline", ["--max-steps", "0"], "--max-steps", "0"),
    ("train-offline", ["--max-length", "1"], "--max-length", "1"),
    ("train-offline", ["--seed", "x"], "--seed", "x"),
    ("train-offline", ["--seed", "-1"], "--seed", "-1"),
    ("train-offline", ["--seed", "4294967296"], "--seed", "4294967296"),
    ("train-offline", ["--lora-r", "-1"], "--lora-r", "-1"),
    ("train-offline", ["--lora-alpha", "0"], "--lora-alpha", "0"),
    ("train-offline", ["--lora-targets", ","], "--lora-targets", "','"),
    ("train-offline", ["--merge"], "--merge", "True"),  # only with LoRA
    ("train-offline", ["--dtype", "fp16"], "--dtype", "fp16"),
    ("train-offline", ["--device", "mps"], "--device", "mps"),
    ("train-offline", ["--save-every", "-1"], "--save-every", "-1"),
    ("train-offline", ["--keep-checkpoints", "0"], "--keep-checkpoints", "0"),
    ("inspect", ["--traj", "a", "--group", "b"], "--traj", "'b'"),
    ("inspect", ["--top", "0"], "--top", "0"),
    ("inspect", ["--top", "many"], "--top", "many"),
    ("inspect", ["--by", "reward"], "--by", "reward"),
    ("inspect", ["--compare", "grpo,ppo"], "--compare", "ppo"),
    ("inspect", ["--compare", "gaca"], "--compare", "gaca"),
    ("inspect", ["--plot", "figures.txt"], "--plot", "figures.txt"),  # a format matplotlib does not write
    ("inspect", ["--compare", ","], "--compare", "','"),
    ("inspect", ["--compare", ""], "--compare", "''"),
    ("inspect", ["--compare", "grpo,gaca", "--by", "nll"], "--by", "nll"),
    ("inspect", ["--compare", "grpo,gaca", "--lowest"], "--lowest", "True"),
    ("demo", ["--games", "0"], "--games", "0"),
    ("demo", ["--rollouts", "1"], "--rollouts", "1"),
    ("demo", ["--iterations", "-1"], "--iterations", "-1"),
    ("demo", ["--methods", "ppo"], "--methods", "ppo"),
    ("demo", ["--methods", " , "], "--methods", "' , '"),
    ("demo", ["--seed", "x"], "--seed", "x"),
    ("demo", ["--seed", "-1"], "--seed", "-1"),
    ("demo", ["--bc-steps", "0"], "--bc-steps", "0"),
]
# options that take any value of their type (free text, a seed, an on/off flag)
ANY_VALUE = {
    "score": {
        "revision",
        "trust_remote_code",
        "token_logprobs",
        "add_special_tokens",
        "strict_prefix",
        "pack",
        "share_prefixes",
        "resume",
    },
    "train-offline": {"revision", "trust_remote_code", "add_special_tokens", "strict_prefix", "gradient_checkpointing"},
    "inspect": {"group"},
    "demo": set(),
}


@pytest.mark.parametrize("command,args,flag,value", INVALID, ids=[f"{c} {' '.join(a)}" for c, a, _, _ in INVALID])
def test_invalid_value_is_a_usage_error_naming_its_flag(tmp_path, monkeypatch, command, args, flag, value):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [command, *BASE[command], *args])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and res.stdout == ""
    message = res.stderr.strip().splitlines()[-1]
    hint, _, text = message.partition(": ")[2].partition(": ")
    assert hint.startswith("Invalid value for ") and f"'{flag}'" in hint, res.stderr
    assert value in text, res.stderr
    assert re.search(r"; (use|drop) ", text), res.stderr  # and what to use instead
    assert not any(tmp_path.iterdir())  # nothing written, no directory made


def test_an_option_that_only_acts_with_another_names_it(tmp_path, monkeypatch):
    """`--beta 0.5 -m grpo` says what --beta needs; the same value with it, or the default
    value without it, is not refused (a script may pass the defaults to every method)."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, ["advantages", *BASE["advantages"], "-m", "grpo", "--beta", "0.5"])
    assert res.exit_code == 2 and "beta = 0.5 has no effect unless --method gaca; drop it" in res.stderr
    res = runner.invoke(app, ["train-offline", *BASE["train-offline"], "--lora-alpha", "8"])
    assert res.exit_code == 2 and "lora_alpha = 8.0 has no effect unless --lora-r is given; drop it" in res.stderr
    for args in (
        ["-m", "gaca", "--beta", "0.5"],
        ["-m", "grpo", "--beta", "0.1"],
        ["--anchor-similarity", "0.9", "--similarity-order", "rows"],
    ):
        res = runner.invoke(app, ["advantages", *BASE["advantages"], *args])
        assert res.exit_code == 1 and "missing.parquet" in res.stderr, (args, res.output)  # past the options


def test_every_option_has_an_invalid_value_case():
    """A new option gets a row in INVALID (or is listed as taking any value)."""
    tested = {(c, flag) for c, _, flag, _ in INVALID}
    for command, cls in CONFIGS.items():
        for f in option_fields(cls):
            if f.name not in ANY_VALUE.get(command, set()):
                assert (command, flag_of(f)) in tested, f"no invalid-value case for `gaca {command} {flag_of(f)}`"


# --------------------------------------------------------------------------- the mechanism


@dataclasses.dataclass(frozen=True)
class Toy:
    name: str = dataclasses.field(metadata={"help": "Required text.", "short": "-n"})
    count: int = dataclasses.field(default=3, metadata={"help": "A count ≥ 1."})
    ratio: float | None = dataclasses.field(default=None, metadata={"help": "Optional ratio.", "metavar": "R"})
    fast: bool = dataclasses.field(default=True, metadata={"help": "On by default."})
    loud: bool = dataclasses.field(default=False, metadata={"help": "Off by default."})
    tags: tuple[str, ...] = dataclasses.field(default=("a", "b"), metadata={"help": "Comma-separated tags."})
    mode: Literal["quick", "slow"] | None = dataclasses.field(
        default=None, metadata={"help": "A choice.", "default_text": "quick"}
    )
    level: Literal[1, 2, 3] = dataclasses.field(default=1, metadata={"help": "A choice of integers."})
    internal: int = 7  # no help: not an option

    def __post_init__(self) -> None:
        check_choices(self)
        if self.count < 1:
            raise ConfigError("count", f"count = {self.count!r} is not valid; use an integer ≥ 1")
        if self.internal < 0:
            raise ConfigError("internal", f"internal = {self.internal!r} is not valid; use ≥ 0")


toy_app = typer.Typer(rich_markup_mode=None, add_completion=False)


@toy_app.command()
@config_options(Toy)
def toy(
    path: str = typer.Argument(...),
    *,
    options: ConfigOptions[Toy],
    internal: int = typer.Option(7, "--internal"),
    verbose: bool = typer.Option(False, "--verbose"),
) -> None:
    """A toy command."""
    config = options.build(internal=internal)
    typer.echo(repr((path, config, verbose)))


def run_toy(*args: str):
    return runner.invoke(toy_app, list(args))


def test_defaults_and_conversions():
    res = run_toy("p", "-n", "x")
    assert res.exit_code == 0, res.output
    assert res.stdout.strip() == repr(("p", Toy(name="x"), False))
    res = run_toy(
        "p", "--name", "x", "--count", "5", "--ratio", "0.5", "--no-fast", "--loud", "--tags", " c, d ,", "--verbose",
        "--mode", "slow", "--level", "3",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    expected = Toy(name="x", count=5, ratio=0.5, fast=False, loud=True, tags=("c", "d"), mode="slow", level=3)
    assert res.stdout.strip() == repr(("p", expected, True))


def test_required_field_is_a_required_option():
    res = run_toy("p")
    assert res.exit_code == 2 and "--name" in res.stderr


def test_help_shows_flags_defaults_and_metavars():
    res = run_toy("--help")
    text = " ".join(res.stdout.split())
    for expected in (
        "-n, --name",
        "Required text.",
        "--count",
        "[default: 3]",
        "--ratio R",
        "--fast / --no-fast",
        "--loud",
        "--tags",
        "[default: a,b]",
        "--mode <quick|slow> A choice. [default: (quick)]",
        "--level <1|2|3>",
        "--verbose",
    ):
        assert expected in text, expected
    assert "Off by default." in text and "--no-loud" not in text


def test_config_error_names_the_flag_and_unparsable_numbers_quote_the_value():
    res = run_toy("p", "-n", "x", "--count", "0")
    assert res.exit_code == 2
    assert "Invalid value for '--count': count = 0 is not valid; use an integer ≥ 1" in res.stderr
    res = run_toy("p", "-n", "x", "--count", "three")
    assert res.exit_code == 2
    assert "Invalid value for '--count': 'three' is not an integer; use an integer, e.g. 3" in res.stderr
    res = run_toy("p", "-n", "x", "--ratio", "half")
    assert res.exit_code == 2 and "'half' is not a number" in res.stderr
    res = run_toy("p", "-n", "x", "--mode", "Slow")
    assert res.exit_code == 2
    assert "Invalid value for '--mode': mode = 'Slow' is not valid; use quick | slow" in res.stderr
    res = run_toy("p", "-n", "x", "--level", "4")
    assert res.exit_code == 2 and "Invalid value for '--level': level = '4' is not valid; use 1 | 2 | 3" in res.stderr


def test_an_error_in_a_field_the_command_supplies_has_no_flag_of_the_config():
    """`internal` is not one of Toy's options: its error is still a usage error, with the
    message (which names the field) and no invented flag."""
    res = run_toy("p", "-n", "x", "--internal", "-1")
    assert res.exit_code == 2
    assert "internal = -1 is not valid" in res.stderr and "'--internal'" not in res.stderr


def test_a_command_without_an_options_parameter_is_refused():
    with pytest.raises(TypeError, match="options"):
        config_options(Toy)(lambda path: None)

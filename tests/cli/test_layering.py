"""Imports point downward only (the layer table in docs/architecture.md), read from the source with `ast`, and the
light commands really run without torch (checked in a fresh interpreter)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gaca_cli"
EXAMPLE_LOG = ROOT / "examples" / "rollouts.parquet"

STDLIB = set(sys.stdlib_module_names) | {"__future__"}
HEAVY = {"torch", "transformers", "peft", "accelerate", "safetensors", "tokenizers"}
UI = {"rich", "typer", "click"}

# The layers, bottom to top (the layer table in docs/architecture.md): a module may import its own layer and those
# below it, never one above. Demos and the command line sit on top and may use everything.
LAYERS = [
    ("gaca_cli.errors", "gaca_cli.config", "gaca_cli.files", "gaca_cli.interrupts"),  # the standard library only
    "gaca_cli.log",
    "gaca_cli.credit",
    "gaca_cli.lm",
    "gaca_cli.integrations",
    "gaca_cli.inspect",
    "gaca_cli.demo",
    "gaca_cli.render",
    "gaca_cli.api",
    "gaca_cli.ray",
    "gaca_cli.cli",
]
DATA_LAYERS = ("gaca_cli.log", "gaca_cli.credit")  # no models, no UI
MATHS = ("gaca_cli.credit.estimators", "gaca_cli.credit._kernels", "gaca_cli.credit._compiled")
MATHS_LIBRARIES = {"numpy", "numba"}  # numba compiles the loops of gaca_cli.credit._kernels
PRESENTATION = {"render", "view", "console"}


def layer_of(module: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(module == prefix or module.startswith(prefix + ".") for prefix in _prefixes(layer)):
            return i
    return None


def _prefixes(layer: str | tuple[str, ...]) -> tuple[str, ...]:
    return (layer,) if isinstance(layer, str) else layer


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def imports_of(path: Path, package: str | None = None) -> tuple[tuple[str, bool], ...]:
    """(absolute module imported, imported at module level?) for every import in the file.
    `package` (default: from the path) resolves relative imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if package is None:
        package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, top) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                found.append((mod, top))
                # `from gaca_cli import render` imports the submodule gaca_cli.render
                found.extend((f"{mod}.{alias.name}", top) for alias in child.names)
            visit(child, inner)

    visit(tree, True)
    return tuple(found)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def roots(imports: tuple[tuple[str, bool], ...], *, top_only: bool = False) -> set[str]:
    return {m.split(".")[0] for m, top in imports if m and (top or not top_only)}


def test_the_listing_shows_the_layers():
    subpackages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert {"log", "credit", "lm", "inspect", "demo", "integrations", "cli"} <= subpackages
    for prefix in (p for layer in LAYERS for p in _prefixes(layer)):
        assert any(name == prefix or name.startswith(prefix + ".") for name in MODULES), prefix


@pytest.mark.parametrize("name", sorted(n for n in MODULES if layer_of(n) is not None))
def test_imports_point_downward(name):
    here = layer_of(name)
    upward = sorted({m for m, _ in imports_of(MODULES[name]) if (layer_of(m) or 0) > here})
    assert not upward, f"{name} imports {upward} (imports must point downward)"


def test_no_module_is_longer_than_700_lines():
    """One job per module (docs/architecture.md): a longer module holds more than one."""
    long = {name: n for name, path in MODULES.items() if (n := len(path.read_text("utf-8").splitlines())) > 700}
    assert not long, long


def test_package_stays_within_its_line_budget():
    """The package holds at most 19,000 lines of Python and its importers at most 3,000: growth is paid for by
    simplifying, not by letting the code sprawl."""

    def lines(folder: Path) -> int:
        return sum(len(path.read_text("utf-8").splitlines()) for path in folder.rglob("*.py"))

    assert lines(PACKAGE) <= 19_000
    assert lines(PACKAGE / "integrations" / "imports") <= 3_000


def test_bottom_layer_uses_the_standard_library_only():
    for name in (n for n in MODULES if layer_of(n) == 0):
        bad = {r for r in roots(imports_of(MODULES[name])) if r not in STDLIB and r != "gaca_cli"}
        assert not bad, f"{name} imports {sorted(bad)}"


def test_no_import_cycles():
    """No module imports one that imports it back, directly or through others. Every import
    counts: those inside functions too (they run later, but a circle of them still means two
    modules that cannot be read, tested or moved apart) and those under TYPE_CHECKING. An
    import of a module's own package (`from gaca_cli.log import columns` names gaca_cli.log)
    is no edge: Python has loaded the package before the module."""
    graph = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for module, _ in imports_of(path):
            if module in MODULES and module != name and not name.startswith(module + "."):
                graph[name].add(module)
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join([*path[path.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


@pytest.mark.parametrize("name", MATHS)
def test_maths_imports_only_numpy_and_stdlib(name):
    imports = imports_of(MODULES[name])
    bad = {r for r in roots(imports) if r not in STDLIB and r not in MATHS_LIBRARIES and r != "gaca_cli"}
    allowed = ("gaca_cli.credit", "gaca_cli.log._kernels", "gaca_cli.log.index")
    bad |= {m for m, _ in imports if m.startswith("gaca_cli.") and not m.startswith(allowed)}
    bad -= {"gaca_cli.log"}
    assert not bad, f"{name} imports {sorted(bad)}"


@pytest.mark.parametrize("name", sorted(n for n in MODULES if n.startswith(DATA_LAYERS)))
def test_data_layers_import_no_models_and_no_ui(name):
    bad = roots(imports_of(MODULES[name])) & (HEAVY | UI)
    assert not bad, f"{name} imports {sorted(bad)}"


def test_only_the_cli_package_imports_typer():
    offenders = {
        name: sorted(roots(imports_of(path)) & {"typer", "click"})
        for name, path in MODULES.items()
        if not name.startswith("gaca_cli.cli")
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_library_never_imports_the_cli():
    offenders = {
        name: sorted(m for m, _ in imports_of(path) if m.startswith("gaca_cli.cli"))
        for name, path in MODULES.items()
        if not name.startswith("gaca_cli.cli") and name != "gaca_cli.__main__"
    }
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, offenders


def test_presentation_modules_do_not_import_torch():
    """render/console, and any library module that uses rich, draw: they never load a model."""
    checked = []
    for name, path in MODULES.items():
        if name.startswith("gaca_cli.cli"):
            continue
        imports = imports_of(path)
        if name.rpartition(".")[2] in PRESENTATION or "rich" in roots(imports) or name.startswith("gaca_cli.inspect"):
            checked.append(name)
            bad = roots(imports) & HEAVY
            assert not bad, f"{name} imports {sorted(bad)}"
    assert "gaca_cli.render" in checked


def test_cli_modules_import_torch_only_inside_commands():
    """`gaca --help` imports every command module: none may import torch at module level."""
    for name, path in MODULES.items():
        if not (name.startswith("gaca_cli.cli") or name in ("gaca_cli", "gaca_cli.__main__")):
            continue
        bad = roots(imports_of(path), top_only=True) & HEAVY
        assert not bad, f"{name} imports {sorted(bad)} at module level"


#: what the library API runs for a command (gaca_cli.api): the commands call the API, never these themselves
API_ONLY = (
    "gaca_cli.lm.scoring",
    "gaca_cli.integrations.imports.core",
    "gaca_cli.credit.reading",
    "gaca_cli.log.checks",
)
#: the command module -> the gaca_cli.api functions it must call
API_CALLS = {
    "gaca_cli.cli.cmd_advantages": ("run_advantages",),
    "gaca_cli.cli.cmd_score": ("run_score",),
    "gaca_cli.cli.cmd_import": ("run_import",),
    "gaca_cli.cli.cmd_validate": ("check", "run_import"),
}


def test_commands_are_thin_layers_over_the_api():
    """advantages, score, import and validate (--from too) go through gaca_cli.api, as `import gaca_cli` does:
    no command module imports the scoring loop, the importer, the log checks or the advantages reader."""
    for name, path in MODULES.items():
        if name.startswith("gaca_cli.cli"):
            bad = sorted({m for m, _ in imports_of(path) if m.startswith(API_ONLY)})
            assert not bad, f"{name} imports {bad}: call gaca_cli.api instead"
    for name, functions in API_CALLS.items():
        imported = {m for m, _ in imports_of(MODULES[name])}
        assert {f"gaca_cli.api.{f}" for f in functions} <= imported, name


def test_ast_reader_sees_nested_and_relative_imports(tmp_path):
    """The reader above tells module-level imports from those inside functions, and resolves
    relative imports (so `from ..cli import app` cannot slip past the layering checks)."""
    src = tmp_path / "fake.py"
    src.write_text("import numpy as np\nfrom ..cli import app\n\ndef f():\n    import torch\n")
    found = imports_of(src, package="gaca_cli.sub")
    assert ("numpy", True) in found
    assert ("gaca_cli.cli", True) in found and ("gaca_cli.cli.app", True) in found
    assert ("torch", False) in found


# --------------------------------------------------------------------------- in a real process

_WRAPPER = r"""
import json, sys
from gaca_cli.cli import app

results = []
for argv in json.loads(sys.argv[1]):
    try:
        app(args=argv, prog_name="gaca")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "transformers", "peft", "accelerate"})
    results.append({"argv": argv, "code": code, "heavy": heavy[:5]})
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


def test_light_commands_do_not_import_torch(tmp_path):
    """--help, advantages (every method), validate and inspect --help in one fresh interpreter:
    after each, neither torch nor transformers is in sys.modules."""
    out = tmp_path / "adv.parquet"
    runs = [
        ["--help"],
        ["validate", str(EXAMPLE_LOG)],
        ["advantages", str(EXAMPLE_LOG), "--method", "grpo", "-o", str(out)],
        ["advantages", str(EXAMPLE_LOG), "--method", "gigpo", "-o", str(out)],
        ["advantages", str(EXAMPLE_LOG), "--method", "gaca", "-o", str(out)],
        ["inspect", "--help"],
    ]
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-c", _WRAPPER, json.dumps(runs), str(report)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(report.read_text())
    for r in results:
        assert not r["heavy"], f"`gaca {' '.join(r['argv'][:2])}` imported {r['heavy']}"
    codes = {tuple(r["argv"][:1]): r["code"] for r in results}
    assert codes[("--help",)] == 0 and codes[("validate",)] == 0
    assert all(r["code"] == 0 for r in results if r["argv"][0] == "advantages"), results
    assert out.exists()
    if "No such command" not in proc.stderr:  # inspect may not be registered yet
        assert codes[("inspect",)] == 0, proc.stderr


def test_help_does_not_import_numba_pyarrow_or_polars():
    """Importing the command line (`gaca --help`, option parsing) loads none of numba (the
    kernels of `gaca advantages`, ~0.4 s), pyarrow or polars: commands import them on use."""
    heavy = "{'numba', 'llvmlite', 'pyarrow', 'polars'}"
    code = f"import sys\nfrom gaca_cli.cli import app\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {heavy})[:3])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_validate_does_not_import_numba():
    """Checking a log uses numpy only: `gaca validate` never pays numba's start-up."""
    code = (
        "import sys\nfrom gaca_cli.cli import app\n"
        f"try:\n    app(args=['validate', {str(EXAMPLE_LOG)!r}], prog_name='gaca')\nexcept SystemExit:\n    pass\n"
        "print('numba' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False", proc.stdout

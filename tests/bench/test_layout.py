"""The research harness ships with the benchmarks, not with the package: no module of
gaca_cli imports `bench`, and bench/harness reaches the package only through its public layers."""

from __future__ import annotations

from pathlib import Path

from tests.cli.test_layering import MODULES, ROOT, imports_of

HARNESS = ROOT / "bench" / "harness"


def test_the_package_does_not_import_the_harness():
    offenders = {
        name: sorted(m for m, _ in imports_of(path) if m == "bench" or m.startswith("bench."))
        for name, path in MODULES.items()
    }
    assert not {k: v for k, v in offenders.items() if v}
    assert not any(name.rpartition(".")[2] in {"experiment", "regimes", "key_quests"} for name in MODULES)


def test_the_harness_imports_resolve():
    """Every gaca_cli module the harness imports exists (it moves with the package's layout)."""
    missing = set()
    for path in sorted(HARNESS.glob("*.py")):
        for module, _ in imports_of(path, package="bench.harness"):
            if module.startswith("gaca_cli.") and module not in MODULES and module.rpartition(".")[0] not in MODULES:
                missing.add(f"{Path(path).name}: {module}")
    assert not missing, sorted(missing)

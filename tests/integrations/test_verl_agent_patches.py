"""examples/verl_agent/*.patch applied to unmodified verl-agent files, then run where they can be.

The fixtures under data/verl_agent_upstream/<commit>/ are verl-agent's own files (LICENSE and
PROVENANCE beside them): 796ed31, the newest upstream commit reachable, and 2c54a7c9, a commit
of a fork's side branch that gaca's docs used to cite. Each patch must apply with `git apply`
(no fuzz: exact context, offsets only), and the functions it changes are then taken from the
patched file and run: `TrajectoryCollector.multi_turn_loop` with the export hook, and
`compute_advantage` with the GACA branch. verl itself is not installed, so the methods those
functions call (`vanilla_multi_turn_loop`, `gather_rollout_data`) and the batch are stand-ins.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import textwrap
from enum import Enum
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from gaca_cli.integrations.imports import verl_agent  # noqa: E402
from gaca_cli.integrations.imports.base import ImportOptions  # noqa: E402
from gaca_cli.integrations.verl_agent import compute_gaca_outcome_advantage  # noqa: E402
from tests.integrations.test_verl_agent_export import _rollout  # noqa: E402
from tests.integrations.verl_agent_reference import make_batch  # noqa: E402
from tests.lm.tiny_models import build_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = Path(__file__).parent / "data" / "verl_agent_upstream"
PATCHES = {name: ROOT / "examples" / "verl_agent" / f"{name}.patch" for name in ("export", "gaca_advantage")}
COMMITS = ["796ed31", "2c54a7c9"]
ROLLOUT_LOOP = "agent_system/multi_turn_rollout/rollout_loop.py"
RAY_TRAINER = "verl/trainer/ppo/ray_trainer.py"
# values vanilla_multi_turn_loop returns at each commit (796ed31 adds the tool-call counts)
LOOP_VALUES = {"796ed31": 6, "2c54a7c9": 5}

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


@pytest.fixture(scope="module", params=COMMITS)
def patched(request, tmp_path_factory) -> tuple[str, Path]:
    """A git repository holding the commit's unmodified files, both patches applied."""
    commit = request.param
    repo = tmp_path_factory.mktemp(f"verl-agent-{commit}")
    for path in (ROLLOUT_LOOP, RAY_TRAINER):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(UPSTREAM / commit / path, repo / path)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    assert _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", commit).returncode == 0
    for name, patch in PATCHES.items():
        check = _git(repo, "apply", "--check", "-v", str(patch))
        assert check.returncode == 0, f"{name}.patch on {commit}: {check.stderr}"
        applied = _git(repo, "apply", str(patch))
        assert applied.returncode == 0, applied.stderr
    return commit, repo


@pytest.mark.parametrize("commit", COMMITS)
def test_the_fixtures_are_the_upstream_files_with_license_and_provenance(commit):
    folder = UPSTREAM / commit
    assert "Apache License" in (folder / "LICENSE").read_text("utf-8")
    provenance = (folder / "PROVENANCE").read_text("utf-8")
    assert commit in provenance and ROLLOUT_LOOP in provenance and RAY_TRAINER in provenance
    assert "gaca" not in (folder / ROLLOUT_LOOP).read_text("utf-8")
    assert "gaca" not in (folder / RAY_TRAINER).read_text("utf-8").lower()


def test_no_hunk_is_anchored_at_a_files_first_lines():
    for patch in PATCHES.values():
        headers = [line for line in patch.read_text("utf-8").splitlines() if line.startswith("@@")]
        assert headers and all(not line.startswith(("@@ -1,", "@@ -0,")) for line in headers), patch.name


def test_both_patches_apply_and_the_patched_files_compile(patched):
    commit, repo = patched
    changed = _git(repo, "diff", "--name-only").stdout.split()
    assert sorted(changed) == sorted([ROLLOUT_LOOP, RAY_TRAINER])
    for path in (ROLLOUT_LOOP, RAY_TRAINER):
        compile((repo / path).read_text("utf-8"), path, "exec")
    # the patches are what they apply: reversing them gives the upstream files back
    for patch in reversed(PATCHES.values()):
        assert _git(repo, "apply", "--check", "-R", str(patch)).returncode == 0


def _function(path: Path, name: str, cls: str | None = None) -> str:
    """The source of one function (a method of `cls`) of a patched file, dedented."""
    tree = ast.parse(path.read_text("utf-8"))
    scope = tree.body
    if cls is not None:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    return ast.unparse(node)


# --------------------------------------------------------------------------- export.patch


class _GenBatch:
    meta_info: dict = {}

    def repeat(self, repeat_times, interleave):
        return self


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _collector(commit: str, repo: Path, tok):
    """verl-agent's patched multi_turn_loop on a TrajectoryCollector whose loops are stand-ins:
    vanilla_multi_turn_loop returns the test's rollout, gather_rollout_data what it was given."""
    source = _function(repo / ROLLOUT_LOOP, "multi_turn_loop", cls="TrajectoryCollector")
    namespace: dict = {"DataProto": object, "EnvironmentManagerBase": object}  # no `os`: the hook imports it
    exec(compile(source, ROLLOUT_LOOP, "exec"), namespace)  # noqa: S102 (a test fixture)
    total, episode_rewards = _rollout(tok, "torch")
    values = (total, episode_rewards, np.array([3, 2]), np.array([True, False]), np.array(["traj-a", "traj-b"]))
    values += (np.array([0, 0]),) * (LOOP_VALUES[commit] - 5)

    class Collector:
        multi_turn_loop = namespace["multi_turn_loop"]

        def __init__(self):
            env = SimpleNamespace(rollout=SimpleNamespace(n=1), max_steps=3)
            algorithm = SimpleNamespace(filter_groups=SimpleNamespace(enable=False))
            self.config = SimpleNamespace(env=env, algorithm=algorithm)
            self.tokenizer = tok

        def vanilla_multi_turn_loop(self, **kwargs):
            return values

        def gather_rollout_data(self, **kwargs):
            return kwargs

    return Collector(), total, episode_rewards


def test_the_export_hook_writes_the_rollout_export_rollout_writes(patched, tok, tmp_path, monkeypatch):
    commit, repo = patched
    collector, total, episode_rewards = _collector(commit, repo, tok)
    monkeypatch.setenv("GACA_EXPORT_DIR", str(tmp_path / "hook"))
    out = collector.multi_turn_loop(_GenBatch(), actor_rollout_wg=None, envs=None, is_train=True)
    assert out["total_batch_list"] is total  # the loop goes on as before
    from gaca_cli.integrations.verl_agent import export_rollout

    direct = export_rollout(tmp_path / "direct", total, episode_rewards, tok, max_steps=3)
    (written,) = (tmp_path / "hook").iterdir()
    read = [list(verl_agent.read([path], ImportOptions())) for path in (written, direct)]
    assert read[0] == read[1] and len(read[0]) == 5


@pytest.mark.parametrize("setting", ["unset", "empty", "validation"])
def test_without_the_export_the_loop_runs_as_upstreams(patched, tok, tmp_path, monkeypatch, setting):
    commit, repo = patched
    collector, total, _ = _collector(commit, repo, tok)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GACA_EXPORT_DIR", raising=False)
    if setting != "unset":
        monkeypatch.setenv("GACA_EXPORT_DIR", "" if setting == "empty" else str(tmp_path / "out"))
    monkeypatch.setitem(sys.modules, "gaca_cli.integrations.verl_agent", None)  # gaca need not be there
    out = collector.multi_turn_loop(_GenBatch(), None, None, is_train=setting != "validation")
    assert out["total_batch_list"] is total and list(tmp_path.iterdir()) == []


def test_export_without_gaca_installed_fails_with_one_message(patched, tok, tmp_path, monkeypatch):
    commit, repo = patched
    collector, _, _ = _collector(commit, repo, tok)
    monkeypatch.setenv("GACA_EXPORT_DIR", str(tmp_path / "out"))
    monkeypatch.setitem(sys.modules, "gaca_cli.integrations.verl_agent", None)
    with pytest.raises(ImportError, match="GACA_EXPORT_DIR is set but gaca cannot be imported") as info:
        collector.multi_turn_loop(_GenBatch(), None, None)
    assert "pip install gaca-cli" in str(info.value) and info.value.__cause__ is None
    assert not (tmp_path / "out").exists()


def test_an_export_folder_that_cannot_be_written_fails_at_the_first_rollout(patched, tok, tmp_path, monkeypatch):
    commit, repo = patched
    collector, _, _ = _collector(commit, repo, tok)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("GACA_EXPORT_DIR", str(blocker / "gaca"))
    with pytest.raises(OSError, match=r"^gaca export: cannot write to '.*a-file/gaca' \(") as info:
        collector.multi_turn_loop(_GenBatch(), None, None)
    assert "\n" not in str(info.value) and sorted(tmp_path.iterdir()) == [blocker]


# --------------------------------------------------------------------------- gaca_advantage.patch


def _compute_advantage(repo: Path):
    """verl-agent's patched compute_advantage and AdvantageEstimator, run as the file has them."""
    namespace: dict = {"Enum": Enum, "DataProto": object}
    for name in ("AdvantageEstimator", "compute_advantage"):
        exec(compile(_function(repo / RAY_TRAINER, name), RAY_TRAINER, "exec"), namespace)  # noqa: S102
    return namespace["compute_advantage"], namespace["AdvantageEstimator"]


@pytest.mark.parametrize("similarity", [False, True])
def test_the_gaca_branch_of_compute_advantage_runs_the_adapter(patched, similarity):
    """The GACA branch, called as the patched `fit` calls it (`algorithm.gigpo` and
    `algorithm.gaca` passed on), fills data.batch['advantages'] and ['returns'] with the
    adapter's output for those options."""
    commit, repo = patched
    compute_advantage, estimators = _compute_advantage(repo)
    assert estimators("gaca") is estimators.GACA
    batch = make_batch(40)
    data = SimpleNamespace(
        batch={
            "token_level_rewards": batch.token_level_rewards,
            "step_rewards": batch.step_rewards,
            "response_mask": batch.response_mask,
            "old_log_probs": batch.old_log_prob,
        },
        non_tensor_batch={"anchor_obs": batch.anchor_obs, "uid": batch.index, "traj_uid": batch.traj_index},
    )
    gigpo = {"step_advantage_w": 0.5, "mode": "mean_norm", "enable_similarity": similarity, "similarity_thresh": 0.8}
    gaca = {"beta": 0.3, "nll_scope": "group"}
    out = compute_advantage(
        data,
        adv_estimator=estimators.GACA,
        gaca_config=gaca,
        gigpo_config=gigpo,
        step_advantage_w=gigpo["step_advantage_w"],
        gigpo_mode=gigpo["mode"],
    )
    want, _ = compute_gaca_outcome_advantage(
        **batch.gigpo_args(),
        old_log_prob=batch.old_log_prob,
        step_advantage_w=0.5,
        mode="mean_norm",
        enable_similarity=similarity,
        similarity_thresh=0.8,
        **gaca,
    )
    assert out is data and torch.equal(data.batch["advantages"], want) and torch.equal(data.batch["returns"], want)


def test_the_patched_fit_passes_both_configs(patched):
    _, repo = patched
    fit = _function(repo / RAY_TRAINER, "fit", cls="RayPPOTrainer")
    call = next(
        n
        for n in ast.walk(ast.parse(fit))
        if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "compute_advantage"
    )
    passed = {k.arg: ast.unparse(k.value) for k in call.keywords}
    assert passed["gaca_config"] == "self.config.algorithm.get('gaca', None)"
    assert passed["gigpo_config"] == "self.config.algorithm.gigpo"
    assert "AdvantageEstimator.GACA" in fit  # step_rewards computed for GACA as for GiGPO


def test_the_docs_show_the_lines_the_patches_add():
    """docs/formats/verl-agent.md shows export.patch's block, docs/verl-agent.md the GACA branch."""

    def added(patch: Path, containing: str) -> list[str]:
        hunk = next(h for h in patch.read_text("utf-8").split("\n@@")[1:] if containing in h)
        lines = [line[1:] for line in hunk.splitlines() if line.startswith("+")]
        return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]

    def shown(doc: str, after: str) -> list[str]:
        text = (ROOT / "docs" / doc).read_text("utf-8").split(after)[1].split("```python\n")[1].split("```")[0]
        return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]

    def dedented(lines: list[str]) -> list[str]:  # the docs' code blocks start at column 0 where they can
        return textwrap.dedent("\n".join(lines)).splitlines()

    assert dedented(shown("formats/verl-agent.md", "## The patch")) == dedented(
        added(PATCHES["export"], "GACA_EXPORT_DIR")
    )
    assert dedented(shown("verl-agent.md", "The branch it adds:")) == dedented(
        added(PATCHES["gaca_advantage"], "GACA:")
    )

"""Shared fixtures: the one tiny profile every test starts from, a tiny project on disk, a
runner for the ``lmablate`` command in its own process, and the synthetic study of the analysis
tests (:mod:`synthetic_study`) with its report."""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import yaml

from lmablate.config import study as config
from lmablate.config import params, profiles
from lmablate.config.study import StudyConfig
from lmablate.model.gpt import flops_per_token
from lmablate.stages import generate, tokenize

from synthetic_study import (ENV, REPLICATE_1_SEEDS, REPLICATE_1_SHIFT, make_cfg,
                             write_runs)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# The tiny profile: params.yaml with every size cut down so that a stage runs in a second.
# Tests change what they exercise through ``tiny_params(overrides)``, never by hand-building a
# profile of their own.
# a context of 24 holds one 21-character problem of the default format (fields of 5)
TINY_MODEL = {"context_length": 24, "n_layers": 1, "n_heads": 2, "d_model": 16}
TINY_BATCH = 4


# The shipped studies: the defaults (params.yaml) and each profile of conf/profile/, composed
PROFILES = ["default", *profiles.profile_names(ROOT)]


@functools.lru_cache(maxsize=None)
def _profile_text(name: str) -> str:
    return profiles.compose(ROOT, None if name == "default" else name)


def profile_raw(name: str) -> dict:
    """Profile ``name``'s params as ``dvc exp run -S profile=<name>`` writes them, parsed (a
    fresh copy each call); ``default``: the defaults alone."""
    return yaml.safe_load(_profile_text(name))


def profile_config(name: str) -> StudyConfig:
    """Profile ``name``'s validated study config (:func:`profile_raw`)."""
    return params.parse(profile_raw(name))


def budget_for(steps: int, model: Mapping[str, Any] | None = None,
               batch_size: int = TINY_BATCH) -> float:
    """The training FLOPs (``train.budget_flops``) that buy exactly ``steps`` optimizer steps of
    the tiny baseline with ``model`` overrides (e.g. another ``d_model``)."""
    cfg = config.ModelConfig(**{**TINY_MODEL, **(model or {})})
    return float(steps * batch_size * cfg.context_length * flops_per_token(cfg))


def budgets(steps: int, model: Mapping[str, Any] | None = None,
            batch_size: int = TINY_BATCH) -> dict[str, float]:
    """``train.budget_flops`` of both datasets for ``steps`` steps (see :func:`budget_for`)."""
    b = budget_for(steps, model, batch_size)
    return {"arithmetic": b, "shakespeare": b}


TINY = {
    "study": {"seeds": [0], "variants": ["baseline", "rope"], "datasets": ["arithmetic"]},
    # the tiny model's own window and batch (the default's arithmetic has 16 x 64 of its
    # own), and a length split, so that tiny studies run its evaluation too
    "datasets": {"arithmetic": {"n_train": 2000, "n_test": 16, "context_length": None,
                                "batch_size": None, "length_digits": [3, 4]}},
    "model": TINY_MODEL,
    # final runs 4 steps; tuning: 2 trials of half of that, then one lr at the full budget (a
    # bracket of one point on one seed: bracket_points is the last rung's trials)
    "train": {"budget_flops": budgets(4), "eval_interval": 2, "eval_iters": 1,
              "warmup_fraction": 0.0, "batch_size": TINY_BATCH},
    "tune": {"rungs": [[2, 0.5], [1, 1.0]], "trials_per_batch": 2, "reports": 2,
             "d_model_choices": [16], "min_steps": 1, "bracket_seeds": 1, "bracket_points": 1},
    "evaluate": {"max_batches": 1, "batch_size": 8, "max_problems": 8},
    "tracking": {"enabled": False},
}


def merge(base: dict, changes: Mapping[str, Any]) -> dict:
    """``base`` with ``changes`` merged in recursively (mappings merge, anything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def tiny_params(overrides: Mapping[str, Any] | None = None) -> dict:
    """The repository's ``params.yaml`` with :data:`TINY`, then ``overrides``, merged in."""
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    return merge(merge(raw, TINY), overrides or {})


@dataclass
class Project:
    """A folder holding tiny ``params.yaml`` and one dataset's data in ``raw/`` and ``tokens/``
    (see :func:`make_project`), and the config read from it."""

    path: Path
    cfg: StudyConfig

    def write_params(self, change: Callable[[dict], None]) -> None:
        """Apply ``change`` to the raw params and write them back, unvalidated (``cfg`` keeps
        the config the project was made with)."""
        raw = yaml.safe_load((self.path / "params.yaml").read_text())
        change(raw)
        (self.path / "params.yaml").write_text(yaml.safe_dump(raw))


def make_project(path: Path, overrides: Mapping[str, Any] | None = None,
                 dataset: str = "arithmetic") -> Project:
    """Write tiny params (Optuna storage inside ``path``) and ``dataset``'s raw text and tokens
    into ``path/raw`` and ``path/tokens``."""
    path.mkdir(parents=True, exist_ok=True)
    raw = tiny_params(merge({"tune": {"storage": f"sqlite:///{path / 'optuna.db'}"}},
                            overrides or {}))
    (path / "params.yaml").write_text(yaml.safe_dump(raw))
    cfg = params.load(path / "params.yaml")
    generate.run(cfg.dataset(dataset), path / "raw")
    tokenize.run(cfg.dataset(dataset), path / "raw", path / "tokens")
    return Project(path, cfg)


@pytest.fixture()
def project(tmp_path: Path) -> Project:
    """A tiny arithmetic project in a fresh temporary folder."""
    return make_project(tmp_path)


@pytest.fixture(scope="session", name="tiny_params")
def tiny_params_fixture() -> Callable[..., dict]:
    """:func:`tiny_params`, for tests that write params of their own."""
    return tiny_params


@pytest.fixture(scope="session", name="make_project")
def make_project_fixture() -> Callable[..., Project]:
    """:func:`make_project`, for projects with overrides or in module-scoped folders."""
    return make_project


def _env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **(extra or {})}
    for name in ("MLFLOW_TRACKING_URI", "LMABLATE_OPTUNA_STORAGE"):
        if not (extra and name in extra):
            env.pop(name, None)
    return env


def start_lmablate(args: list[str], cwd: Path, env: Mapping[str, str] | None = None,
                   **kw: Any) -> subprocess.Popen:
    """Start ``lmablate <args>`` as its own process in ``cwd`` (a worker as on another machine),
    with stores from the environment only where ``env`` sets them."""
    return subprocess.Popen([sys.executable, "-m", "lmablate.cli", *args], cwd=cwd,
                            env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **kw)


def run_command(cmd: list[str], cwd: Path, timeout: float | None = None,
                env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run a command (``dvc``, ``lmablate``, ``git``) of this environment to completion."""
    return subprocess.run(cmd, cwd=cwd, env=_env(env), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="session", name="start_lmablate")
def start_lmablate_fixture() -> Callable[..., subprocess.Popen]:
    """:func:`start_lmablate`: the CLI in a process of its own."""
    return start_lmablate


@pytest.fixture(scope="session", name="run_command")
def run_command_fixture() -> Callable[..., subprocess.CompletedProcess]:
    """:func:`run_command`: a command of this environment, run to completion."""
    return run_command


@pytest.fixture(scope="session")
def study_root(tmp_path_factory):
    """runs/ of the configured study plus a stale variant "old" that is not part of it."""
    root = tmp_path_factory.mktemp("study")
    write_runs(root / "runs")
    # a stale variant directory that is not part of the configured study
    write_runs(root / "stale", variants=("baseline",))
    (root / "stale" / "shakespeare" / "baseline").rename(root / "runs" / "shakespeare" / "old")
    doc = json.loads((root / "runs/shakespeare/old/metrics.json").read_text())
    doc["variant"] = "old"
    (root / "runs/shakespeare/old/metrics.json").write_text(json.dumps(doc))
    best = json.loads((root / "runs/shakespeare/old/best.json").read_text())
    best["study_name"] = best["study_name"].replace("-baseline-", "-old-")
    (root / "runs/shakespeare/old/best.json").write_text(json.dumps(best))
    return root


@pytest.fixture(scope="session")
def built(study_root):
    """``(cfg, reports dir, paths)`` of the report of :func:`study_root`'s runs
    (:func:`lmablate.stages.report.build_report`), built once and only read by the tests."""
    from lmablate.stages import report  # matplotlib and seaborn: only for the tests that use it
    root = study_root
    cfg = make_cfg()
    out = report.build_report(cfg, root / "runs", root / "reports", environment=ENV)
    return cfg, root / "reports", out


@pytest.fixture(scope="session")
def built_replicated(tmp_path_factory):
    """``(cfg, reports dir, paths)`` of the synthetic study with a second replicate
    (:data:`synthetic_study.REPLICATE_1_SHIFT`: one verdict that does not replicate)."""
    from lmablate.stages import report
    root = tmp_path_factory.mktemp("replicated")
    write_runs(root / "runs", probe=True)
    write_runs(root / "runs", seeds=REPLICATE_1_SEEDS, replicate=1, shift=REPLICATE_1_SHIFT,
               probe=True)
    cfg = make_cfg(replicates=2)
    out = report.build_report(cfg, root / "runs", root / "reports", environment=ENV)
    return cfg, root / "reports", out


@pytest.fixture
def drawn(monkeypatch):
    """The matplotlib Figures the report's figure functions draw in the test, in call order:
    every one goes through :func:`lmablate.report.figures.plotting.figure`, which this records."""
    from contextlib import contextmanager
    from lmablate.report.figures import plotting
    figs = []
    original = plotting.figure

    @contextmanager
    def recording(*args, **kwargs):
        with original(*args, **kwargs) as (fig, axes):
            figs.append(fig)
            yield fig, axes

    monkeypatch.setattr(plotting, "figure", recording)
    return figs


def load_script(path: Path, name: str | None = None):
    """The Python file at ``path`` (a script of ``docs/`` or ``scripts/``, not a package module)
    imported as module ``name`` (default: the file's stem), registered in ``sys.modules``, where
    dataclasses look their module up."""
    import importlib.util
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

"""A user's own FFN, norm or position scheme from the project's components/ folder: named in a
variant, checked before any work, and built like a built-in (lmablate.model.components)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import textwrap
from pathlib import Path

import pytest
import torch

from lmablate.config import params
from lmablate.config.study import ConfigError, ModelConfig
from lmablate.core.component_files import named_components
from lmablate.model import components, gpt
from lmablate.model.variants import preflight

from conftest import tiny_params

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=12, d_model=16, n_heads=2, n_layers=1, context_length=8)


def project(tmp_path: Path, **files: str) -> Path:
    """A folder with ``components/<name>.py`` for each of ``files``."""
    (tmp_path / "components").mkdir()
    for name, text in files.items():
        (tmp_path / "components" / f"{name}.py").write_text(textwrap.dedent(text))
    return tmp_path


@pytest.fixture()
def examples(monkeypatch):
    """The working directory at the repository, whose components/ holds the worked examples."""
    monkeypatch.chdir(ROOT)


def test_the_worked_examples_pass_their_checks_and_build_a_causal_model(examples):
    cfg = ModelConfig(**TINY, ffn="components.squared_relu:SquaredReLU",
                      norm="components.dyt:DyT")
    assert named_components(cfg) == {"ffn": "components.squared_relu:SquaredReLU",
                                                "norm": "components.dyt:DyT"}
    preflight(cfg, "variant 'mine'")  # the contract and check_causality
    model = gpt.GPT(cfg)
    logits, loss = model(torch.randint(12, (2, 8)), torch.randint(12, (2, 8)))
    assert logits.shape == (2, 8, 12) and torch.isfinite(loss)
    # parameter counts treat them as built-ins: the squared ReLU FFN has the ReLU MLP's count
    relu = ModelConfig(**TINY, norm="components.dyt:DyT")
    assert gpt.count_params(cfg) == gpt.count_params(relu)


def test_the_examples_compute_their_papers_formulas(examples):
    cfg = ModelConfig(**TINY)
    x = torch.randn(3, 4, 16)
    sq = components.load_component("components.squared_relu:SquaredReLU")(cfg)
    assert torch.allclose(sq(x), sq.down(torch.relu(sq.up(x)) ** 2))
    dyt = components.load_component("components.dyt:DyT")(cfg)
    with torch.no_grad():
        dyt.weight.uniform_(0.5, 2.0)
        dyt.bias.uniform_(-1.0, 1.0)
    assert torch.allclose(dyt(x), dyt.weight * torch.tanh(0.5 * x) + dyt.bias)


def test_a_variant_names_a_component_and_a_malformed_name_is_refused_with_the_rule():
    raw = tiny_params({"variants": {"mine": {"ffn": "components.squared_relu:SquaredReLU"}},
                       "study": {"variants": ["baseline", "mine"]}})
    assert params.parse(raw).model_config("mine", vocab_size=12).ffn == (
        "components.squared_relu:SquaredReLU")
    raw["variants"]["mine"]["ffn"] = "components/squared_relu.py"
    with pytest.raises(ConfigError, match=r"model\.ffn='components/squared_relu\.py' is not "
                                          r"allowed; choose one of relu, .*, or "
                                          r"components\.<module>:<Class> .*\(in variants\.mine\)"):
        params.parse(raw)


@pytest.mark.parametrize("text,kind,what", [
    ("import torch.nn as nn\nclass Half(nn.Module):\n    def __init__(self, cfg):\n"
     "        super().__init__()\n        self.w = nn.Linear(cfg.d_model, cfg.d_model // 2)\n"
     "    def forward(self, x):\n        return self.w(x)\n",
     "ffn", "maps (2, 5, 16) to (2, 5, 8); an ffn keeps (B, T, C)"),
    ("import torch, torch.nn as nn\nclass Dead(nn.Module):\n    def __init__(self, cfg):\n"
     "        super().__init__()\n        self.g = nn.Parameter(torch.ones(cfg.d_model))\n"
     "    def forward(self, x):\n        return x\n",
     "norm", "parameter g gets no finite gradient"),
    ("import torch.nn as nn\nclass NotAPosition(nn.Module):\n"
     "    def __init__(self, cfg):\n        super().__init__()\n",
     "position", "a position scheme must subclass lmablate.model.gpt.Position"),
    ("raise RuntimeError('half written')\n", "ffn",
     "fails to import: RuntimeError: half written"),
])
def test_a_component_that_breaks_its_contract_is_refused_in_one_line_before_training(
        tmp_path, monkeypatch, text, kind, what):
    monkeypatch.chdir(project(tmp_path, bad=text))
    cls = {"ffn": "Half", "norm": "Dead", "position": "NotAPosition"}[kind]
    if "half written" in what:
        cls = "Anything"
    cfg = ModelConfig(**TINY, **{kind: f"components.bad:{cls}"})
    with pytest.raises(ValueError) as err:
        preflight(cfg, "variant 'mine'")
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith(f"variant 'mine': {kind} components.bad:{cls}")
    assert str(tmp_path / "components" / "bad.py") in line and what in line


def test_a_position_scheme_that_sees_later_tokens_is_refused_by_the_causality_check(
        tmp_path, monkeypatch):
    # each position gets the mean of every token's embedding: the whole sequence, the future too
    monkeypatch.chdir(project(tmp_path, peek="""
        from lmablate.model.gpt import Position

        class Peek(Position):
            def embed(self, x, pos):
                return x + x.mean(dim=1, keepdim=True)
        """))
    cfg = ModelConfig(**TINY, position="components.peek:Peek")
    with pytest.raises(ValueError, match=r"variant 'mine': pre-flight causality check failed: "
                                         r".*position=components\.peek:Peek .*leaks the future"):
        preflight(cfg, "variant 'mine'")


def test_a_missing_file_or_class_is_named(tmp_path, monkeypatch):
    monkeypatch.chdir(project(tmp_path, here="import torch.nn as nn\n"))
    with pytest.raises(components.ComponentError,
                       match=rf"components\.gone:X: {tmp_path / 'components' / 'gone.py'} "
                             "does not exist"):
        components.load_component("components.gone:X")
    with pytest.raises(components.ComponentError, match="has no nn.Module class Missing"):
        components.load_component("components.here:Missing")


def test_an_edited_component_is_imported_again(tmp_path, monkeypatch):
    root = project(tmp_path, edit="import torch.nn as nn\nclass A(nn.Identity):\n    K = 1\n")
    monkeypatch.chdir(root)
    assert components.load_component("components.edit:A").K == 1
    path = root / "components" / "edit.py"
    path.write_text(path.read_text().replace("K = 1", "K = 2"))
    os.utime(path)
    assert components.load_component("components.edit:A").K == 2


def test_a_component_s_file_enters_its_variant_s_fingerprints_and_no_built_in_s(tmp_path,
                                                                              monkeypatch):
    """Study names and seed fingerprints add the sha256 of a variant's component files; a
    built-in variant's are the fingerprint of exactly the parts they had before components."""
    import dataclasses
    from lmablate.core.fingerprint import code_version, component_code, fingerprint
    from lmablate.tune import tuning
    monkeypatch.chdir(project(tmp_path, sq=(ROOT / "components" / "squared_relu.py").read_text()))
    raw = tiny_params({"variants": {"sq": {"ffn": "components.sq:SquaredReLU"}},
                       "study": {"variants": ["baseline", "rope", "sq"]}})
    cfg = params.parse(raw)

    def name(variant: str) -> str:
        return tuning.study_name(cfg, "arithmetic", variant, "data0", 7, "cpu X")

    before = {v: name(v) for v in cfg.study_variants}
    train = dataclasses.replace(cfg.train.for_dataset("arithmetic"), eval_interval=1)
    for variant in ("baseline", "rope"):  # the formula without components, part for part
        assert component_code(cfg.model, cfg.variants[variant]) == []
        assert before[variant] == "arithmetic-{}-{}".format(variant, fingerprint(
            cfg.dataset("arithmetic"), cfg.model, cfg.variants[variant], train,
            dataclasses.replace(cfg.tune, sampler_seed=7), cfg.match_params,
            code_version(tuning.TUNE_CODE), "data0", "cpu X"))
    path = tmp_path / "components" / "sq.py"
    assert component_code(cfg.model, cfg.variants["sq"]) == [
        {"components": {"components/sq.py": hashlib.sha256(path.read_bytes()).hexdigest()}}]
    path.write_text(path.read_text() + "# an edit\n")
    after = {v: name(v) for v in cfg.study_variants}
    assert [v for v in before if before[v] != after[v]] == ["sq"]


def test_match_params_sizes_a_component_ffn_like_a_built_in_and_refuses_one_it_cannot(
        tmp_path, monkeypatch):
    """The squared ReLU FFN sizes its hidden layer by cfg.ffn_hidden_size, so match_params
    matches it as a built-in; an FFN whose count ignores ffn_hidden is refused in one line."""
    from lmablate.model.variants import resolve_model_config
    monkeypatch.chdir(project(tmp_path, sq=(ROOT / "components" / "squared_relu.py").read_text(),
                              fixed="""
        import torch.nn as nn

        class Fixed(nn.Module):
            def __init__(self, cfg):
                super().__init__()
                self.up = nn.Linear(cfg.d_model, 2 * cfg.d_model)
                self.down = nn.Linear(2 * cfg.d_model, cfg.d_model)

            def forward(self, x):
                return self.down(self.up(x).relu())
        """))
    raw = tiny_params({"variants": {"sq": {"ffn": "components.sq:SquaredReLU"},
                                    "big": {"ffn": "components.sq:SquaredReLU", "ffn_hidden": 99},
                                    "fixed": {"ffn": "components.fixed:Fixed"}},
                       "study": {"variants": ["baseline", "sq", "big", "fixed"],
                                 "match_params": True}})
    cfg = params.parse(raw)
    base = gpt.count_params(resolve_model_config(cfg, "baseline", 12, 16))[1]
    for variant in ("sq", "big"):
        matched = resolve_model_config(cfg, variant, 12, 16)
        assert abs(gpt.count_params(matched)[1] - base) <= 0.02 * base
    with pytest.raises(ValueError) as err:
        resolve_model_config(cfg, "fixed", 12, 16)
    assert str(err.value) == (
        "variant 'fixed': study.match_params: ffn components.fixed:Fixed's parameter count does "
        "not grow with ffn_hidden, so it cannot be matched to the baseline's; size its hidden "
        "layer by cfg.ffn_hidden_size, or set match_params: false")


PEEK = """
from lmablate.model.gpt import Position

class Peek(Position):
    def embed(self, x, pos):  # every position gets the mean over the sequence: the future too
        return x + x.mean(dim=1, keepdim=True)
"""
HALF = """
import torch.nn as nn

class Half(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w = nn.Linear(cfg.d_model, cfg.d_model // 2)

    def forward(self, x):
        return self.w(x)
"""


@pytest.mark.parametrize("variant,overrides,line", [
    ("peek", {"position": "components.peek:Peek"},
     r"lmablate: error: variant 'peek': pre-flight causality check failed: .*"
     r"position=components\.peek:Peek.* leaks the future.*"),
    ("half", {"ffn": "components.half:Half"},
     r"lmablate: error: variant 'half': ffn components\.half:Half \(.*components/half\.py\): "
     r"maps \(2, 5, \d+\) to \(2, 5, \d+\); an ffn keeps \(B, T, C\)"),
])
def test_the_tune_stage_refuses_a_broken_component_in_one_line_with_nothing_written(
        project, monkeypatch, capsys, variant, overrides, line):
    from lmablate import cli
    (project.path / "components").mkdir()
    (project.path / "components" / "peek.py").write_text(PEEK)
    (project.path / "components" / "half.py").write_text(HALF)
    project.write_params(lambda raw: (raw["variants"].update({variant: overrides}),
                                      raw["study"].update(variants=["baseline", variant])))
    monkeypatch.chdir(project.path)
    before = sorted(p for p in project.path.rglob("*") if "__pycache__" not in p.parts)
    assert cli.main(["tune", "arithmetic", variant, "--tokens", "tokens", "--best", "best.json",
                     "--trials", "trials.csv"]) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(line + "\n", err), err
    after = sorted(p for p in project.path.rglob("*") if "__pycache__" not in p.parts)
    assert after == before  # no best.json, trials.csv, Optuna storage or MLflow store


# ---- end to end -------------------------------------------------------------------------------

def _stage_names(status: str) -> set[str]:
    """The stages ``dvc status --json`` names."""
    return set(json.loads(status))


@pytest.mark.slow
def test_a_tiny_study_with_a_user_component_runs_through_dvc_and_an_edit_reruns_only_it(
        tmp_path, tiny_params, run_command):
    """``dvc repro`` of a tiny arithmetic study (baseline and ``sq``, the squared ReLU FFN of
    components/, two seeds, MLflow off) reports ``sq`` against the baseline; an edit of its
    file then changes the check stage alone, and once that has run, exactly ``sq``'s stages."""
    from test_pipeline import new_study  # the tiny project as a fresh folder, components/ too
    raw = tiny_params({"study": {"seeds": [0, 1], "variants": ["baseline", "sq"]},
                       "variants": {"sq": {"ffn": "components.squared_relu:SquaredReLU"}}})
    raw["tracking"]["enabled"] = False
    study = new_study(tmp_path / "study", raw, run_command)
    first = run_command(["dvc", "repro"], study, timeout=1200)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = (study / "reports" / "comparisons.csv").read_text().splitlines()
    assert any(",sq," in row for row in rows[1:]), rows
    record = (study / "data" / "components" / "sq.txt").read_text()
    assert record.startswith("ffn components.squared_relu:SquaredReLU components/squared_relu.py "
                             "sha256 ")
    assert (study / "data" / "components" / "baseline.txt").read_text() == (
        "no component of components/\n")
    assert _stage_names(run_command(["dvc", "status", "--json"], study).stdout) == set()

    source = study / "components" / "squared_relu.py"
    source.write_text(source.read_text() + "# an edit\n")
    status = json.loads(run_command(["dvc", "status", "--json"], study).stdout)
    assert status == {"check": [{"changed deps": {"components": "modified"}}]}
    checked = run_command(["dvc", "repro", "check"], study, timeout=600)
    assert checked.returncode == 0, checked.stderr[-3000:]
    assert _stage_names(run_command(["dvc", "status", "--json"], study).stdout) == {
        f"{stage}@arithmetic-sq" for stage in ("tune", "train", "evaluate")}
    # dvc repro runs those, and the report that reads their results: the baseline's are kept
    again = run_command(["dvc", "repro"], study, timeout=1200)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    ran = set(re.findall(r"Running stage '([^']+)'", again.stdout))
    assert ran == {"tune@arithmetic-sq", "train@arithmetic-sq", "evaluate@arithmetic-sq",
                   "report"}, again.stdout[-3000:]

"""A user's own FFN, norm or position scheme from the project's components/ folder: named in a
variant, checked before any work, and built like a built-in (lmablate.model.components)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

from lmablate.config import params
from lmablate.config.study import ConfigError, ModelConfig
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
    assert components.component_names(cfg) == {"ffn": "components.squared_relu:SquaredReLU",
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

"""docs/params_reference.py: every key of every section of params.yaml is on the page, with its
default, a description and what is allowed, and its fingerprint column says what the code does."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from lmablate.config import params
from lmablate.config.study import SECTIONS, SplitConfig
from lmablate.core.validation import is_param
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
# init fields that are not keys of params.yaml: the tokenizer sets the vocabulary, an entry's
# name is its key in the datasets section
NOT_KEYS = {("model", "vocab_size"), ("variants", "vocab_size"), ("model", "line_length"),
            ("variants", "line_length"), ("datasets", "name")}


def load_reference():
    return load_script(ROOT / "docs" / "params_reference.py")


@pytest.fixture(scope="module")
def script():
    return load_reference()


@pytest.fixture(scope="module")
def page(script):
    return script.render()


def tables(page: str) -> dict[str, dict[str, list[str]]]:
    """Each ``## section``'s table rows by their first cell (without backticks)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for line in page.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            out[section] = {}
        elif section and line.startswith("| `"):
            # a cell's own | is written \|
            cells = [c.strip().replace("\0", "|")
                     for c in line.strip("|").replace("\\|", "\0").split("|")]
            out[section][cells[0].strip("`")] = cells
    return out


def plain(value):
    """A default as YAML reads it back: tuples as lists, a dataclass as a mapping."""
    if dataclasses.is_dataclass(value):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def test_the_page_has_its_title_and_every_section(page):
    assert page.startswith("# params.yaml reference\n")
    assert list(tables(page)) == list(params.TOP_LEVEL_KEYS)


def test_every_init_field_is_a_documented_key():
    """A field added without param() would be no key of params.yaml and not on the page."""
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.init and (section, f.name) not in NOT_KEYS:
                assert is_param(f), f"{section}.{f.name} is not declared with param()"
                assert f.metadata["doc"].strip(), f"{section}.{f.name} has no description"
                assert f.metadata["rule"] is not None, f"{section}.{f.name} has no rule"
    for f in dataclasses.fields(SplitConfig):
        assert is_param(f) and f.metadata["doc"].strip()


@pytest.mark.parametrize("section", [s for s in params.TOP_LEVEL_KEYS if s != "variants"])
def test_every_key_is_on_the_page_with_its_default_type_rule_and_description(page, section):
    rows = tables(page)[section]
    fields = [(f.name, f) for f in dataclasses.fields(SECTIONS[section]) if is_param(f)]
    if section == "datasets":
        fields += [(f"split.{f.name}", f) for f in dataclasses.fields(SplitConfig)]
    assert set(rows) == {name for name, _ in fields}
    for name, f in fields:
        key, type_, default, allowed, doc, fingerprint, reruns = rows[name]
        assert type_ == f"`{f.type}`", name
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            assert default == "(none)", name
        else:
            value = f.default_factory() if f.default is dataclasses.MISSING else f.default
            assert yaml.safe_load(default.strip("`")) == plain(value), name
        assert allowed == f.metadata["rule"].allowed, name
        assert f.metadata["doc"] in doc, name
        assert fingerprint and reruns, name


def test_the_variants_of_params_yaml_are_listed(page):
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    rows = tables(page)["variants"]
    assert set(rows) == set(raw["variants"])
    for name in raw["study"]["variants"]:
        assert rows[name][2] == "yes"


def column(page, section, key):
    return tables(page)[section][key][5]


def test_the_fingerprint_column_follows_the_code(page):
    """What the stages' fingerprints are known to take: a trial validates tune.reports times
    (train.eval_interval does not name its study), a final run's width is the tuned one,
    runtime, tracking and evaluate settings enter neither, study.seeds a seed's only."""
    assert column(page, "train", "eval_interval") == "seed"
    assert column(page, "train", "eval_iters") == "tune, seed"
    assert column(page, "model", "d_model") == "tune"
    assert column(page, "model", "ffn") == "tune, seed"
    assert column(page, "study", "seeds") == "seed"
    assert column(page, "study", "match_params") == "tune, seed"
    assert column(page, "tune", "rungs") == "tune"
    for key in ("storage", "heartbeat_seconds"):
        assert column(page, "tune", key) == "no"
    for section in ("evaluate", "tracking"):
        assert all(row[5] == "no" for row in tables(page)[section].values())
    for key in ("workers", "parallel"):
        assert column(page, "runtime", key) == "no"
    assert tables(page)["runtime"]["device"][6] == "none"  # no stage's param


def test_the_resolved_device_type_enters_a_seed_fingerprint(script, monkeypatch):
    """The page's note on runtime.device: the seed fingerprint takes the kind of device the
    setting resolves to (on this machine every setting resolves to the CPU, so the page cannot
    find it by trying)."""
    import torch

    from lmablate.stages import train
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    cpu = script._fingerprints(raw, "arithmetic", "baseline")
    monkeypatch.setattr(train, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(train, "numerics_kind", lambda device: f"{device.type} NVIDIA H200")
    cuda = script._fingerprints(raw, "arithmetic", "baseline")
    assert cpu["seed"] != cuda["seed"] and cpu["tune"] == cuda["tune"]
    assert "kind of device" in script._ALSO["runtime.device"]


def test_the_reruns_column_follows_dvc_yaml(page):
    # a replicate's stages (study.replicates) depend on the same params as the first's
    assert tables(page)["tune"]["sampler_seed"][6] == "tune, tune-replicate"
    assert tables(page)["evaluate"]["max_batches"][6] == "evaluate, evaluate-replicate"
    assert tables(page)["tracking"]["uri"][6] == "none"
    assert tables(page)["datasets"]["n_train"][6] == "generate, tokenize"

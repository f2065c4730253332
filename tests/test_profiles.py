"""Profiles: conf/config.yaml (the defaults) and conf/profile/<name>.yaml (what a profile changes),
composed by Hydra as ``dvc exp run -S profile=<name>`` does (lmablate.config.profiles)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lmablate.config import params, profiles
from lmablate.config.study import ConfigError

from conftest import PROFILES, merge, profile_raw

ROOT = Path(__file__).resolve().parents[1]
NAMES = PROFILES[1:]


def test_params_yaml_is_the_defaults_composition_byte_for_byte():
    """So `dvc exp run` with no -S rewrites params.yaml to the same bytes (git stays clean), and
    `dvc repro` on the committed file runs the default study."""
    assert (ROOT / "params.yaml").read_text() == profiles.compose(ROOT)


def test_dvc_composes_params_with_hydra_from_conf():
    shown = subprocess.run([str(Path(sys.executable).parent / "dvc"), "config", "hydra.enabled"],
                           cwd=ROOT, capture_output=True, text=True)
    assert shown.stdout.strip() == "true"
    assert (ROOT / profiles.CONFIG_DIR / f"{profiles.CONFIG_NAME}.yaml").is_file()
    assert NAMES == ["components", "full", "length", "replicate", "scaling", "seed-scale",
                     "speed"]


@pytest.mark.parametrize("name", NAMES)
def test_a_profile_is_the_defaults_with_its_file_merged_over_them(name):
    """Mappings merge key by key, a list replaces the list; nothing else changes (checked with
    an independent merge, not Hydra's), and the result is a valid study labelled by its name."""
    defaults = yaml.safe_load((ROOT / "params.yaml").read_text())
    change = yaml.safe_load((ROOT / "conf" / "profile" / f"{name}.yaml").read_text())
    composed = profile_raw(name)
    assert composed == merge(defaults, change)
    assert composed["study"]["profile"] == name and defaults["study"]["profile"] == "default"
    assert params.parse(composed).profile == name


@pytest.mark.parametrize("name", NAMES)
def test_a_profile_file_holds_only_what_differs_from_the_defaults(name):
    """A value equal to the default's is no change: a profile that repeats one would keep it
    when the default moves."""
    defaults = yaml.safe_load((ROOT / "params.yaml").read_text())
    change = yaml.safe_load((ROOT / "conf" / "profile" / f"{name}.yaml").read_text())

    def same(d: dict, c: dict, path: str) -> list[str]:
        out = []
        for key, value in c.items():
            if isinstance(value, dict) and isinstance(d.get(key), dict):
                out += same(d[key], value, f"{path}{key}.")
            elif key in d and d[key] == value:
                out.append(path + key)
        return out
    assert same(defaults, change, "") == []
    first = (ROOT / "conf" / "profile" / f"{name}.yaml").read_text().splitlines()[0]
    assert first == "# @package _global_"  # else Hydra nests it under `profile:`


def test_an_override_changes_one_key_of_a_profile():
    composed = yaml.safe_load(profiles.compose(ROOT, "speed", ["study.seeds=[0,1]",
                                                              "train.lr=0.001"]))
    assert composed == merge(profile_raw("speed"), {"study": {"seeds": [0, 1]},
                                                    "train": {"lr": 0.001}})


@pytest.mark.parametrize("profile,overrides,message", [
    ("nope", [], "profile: unknown profile 'nope'; choose one of components, full, length, "
                 "replicate, scaling, seed-scale, speed (files of conf/profile/)"),
    (None, ["train.lrr=1"], "override: Could not override 'train.lrr'. To append to your config "
                            "use +train.lrr=1"),
    (None, ["train.lr=["], "override: no viable alternative at input '['"),
])
def test_an_unknown_profile_or_a_bad_override_is_one_clear_error(profile, overrides, message):
    with pytest.raises(ConfigError) as err:
        profiles.compose(ROOT, profile, overrides)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def _project(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "conf", tmp_path / "conf")
    (tmp_path / "params.yaml").write_text("kept\n")
    return tmp_path


@pytest.mark.parametrize("argv,line", [
    (["--profile", "nope"], "lmablate: error: profile: unknown profile 'nope'; choose one of "),
    (["-S", "train.lr=abc"], "lmablate: error: params: train.lr='abc' is not allowed; expected "
                             "a finite number"),
    (["-S", "study.variants=[baseline,nosuch]"], "lmablate: error: params: study.variants='nosuch' "
                                               "is not allowed; choose from "),
])
def test_lmablate_compose_refuses_before_writing(tmp_path, run_command, argv, line):
    project = _project(tmp_path)
    done = run_command(["lmablate", "compose", *argv], project)
    assert done.returncode == 2 and done.stderr.startswith(line), done.stderr
    assert done.stderr.count("\n") == 1
    assert (project / "params.yaml").read_text() == "kept\n"  # nothing written


def test_lmablate_compose_writes_what_dvc_exp_run_would(tmp_path, run_command):
    project = _project(tmp_path)
    done = run_command(["lmablate", "compose", "--profile", "length", "-S", "study.seeds=[0]"],
                       project)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("lmablate compose: wrote params.yaml (length study.seeds=[0])\n")
    assert (project / "params.yaml").read_text() == profiles.compose(ROOT, "length",
                                                                      ["study.seeds=[0]"])
    shown = run_command(["lmablate", "compose", "--out", "-"], project)
    assert shown.stdout == (ROOT / "params.yaml").read_text()


# The last commit with the profiles as full copies of params.yaml (profiles/<name>.yaml), and
# the profiles it had (those written since were files of conf/profile/ from the start).
COPIES = "80e2263"
COPIED = ["full", "length", "replicate", "scaling", "seed-scale", "speed"]


# Deliberate changes since COPIES: merged into what a profile's copy changed. The default
# arithmetic task became compact, one problem per window (datasets.arithmetic.context_length 16,
# batch_size 64); a profile that pads its fields for length splits keeps the model's window.
# Keys added since: seed 000's task keeps the model's window and uniform sampling. The default's
# widths narrowed to [50, 200] tokens per parameter (its time); the arithmetic profiles at
# 4.5e11 keep the range before, where d_model 24 learns. The default went to six seeds; the
# scaling profile keeps the five it was measured with.
_OWN_WINDOW = {"context_length": None, "batch_size": None}
_SEED_TASK = {"arithmetic_seed": {"sampling": "uniform", **_OWN_WINDOW}}
_WIDE_WIDTHS = {"tune": {"tokens_per_parameter": [20, 650],
                         "tokens_per_parameter_limits": [5, 650]}}
SINCE_COPIES = {
    "length": {"datasets": {"arithmetic": {"length_digits": [3, 4], **_OWN_WINDOW}},
               **_WIDE_WIDTHS},
    "speed": _WIDE_WIDTHS,
    "full": {"datasets": _SEED_TASK},
    "scaling": {"study": {"seeds": [0, 1, 2, 3, 4]}},
    "seed-scale": {"datasets": {"arithmetic": _OWN_WINDOW, **_SEED_TASK}},
}


def _merged(base: dict, more: dict) -> dict:
    """``base`` with ``more`` merged in, mappings key by key."""
    out = dict(base)
    for key, value in more.items():
        out[key] = (_merged(out[key], value) if isinstance(value, dict)
                    and isinstance(out.get(key), dict) else value)
    return out


def _changes(base: dict, full: dict) -> dict:
    """What ``full`` changes against ``base``: its keys whose values differ, mappings key by key."""
    out = {}
    for key, value in full.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            if inner := _changes(base[key], value):
                out[key] = inner
        elif base.get(key, object()) != value:
            out[key] = value
    return out


@pytest.mark.parametrize("name", COPIED)
def test_a_profile_makes_the_changes_its_old_full_copy_made(name, run_command):
    """The conversion from full copies kept each profile's meaning: what the composed profile
    changes against today's defaults is what its copy at COPIES changed against that day's
    params.yaml. A deliberate change of a profile moves COPIES to the commit that makes it."""
    old = {}
    for path in ("params.yaml", f"profiles/{name}.yaml"):
        shown = run_command(["git", "show", f"{COPIES}:{path}"], ROOT)
        if shown.returncode != 0:
            pytest.skip(f"no commit {COPIES} here (a shallow clone)")
        old[path] = yaml.safe_load(shown.stdout)
    defaults = yaml.safe_load((ROOT / "params.yaml").read_text())
    now = _changes(defaults, profile_raw(name))
    assert now["study"].pop("profile") == name  # the label is new
    if not now["study"]:
        del now["study"]
    assert now == _merged(_changes(old["params.yaml"], old[f"profiles/{name}.yaml"]),
                          SINCE_COPIES.get(name, {}))


# A profile file's text -> the one line compose refuses it with (file, what is wrong)
BAD_PROFILES = [
    ("# @package _global_\nstudy: {profile: bad\n",
     "conf/profile/bad.yaml is not valid YAML: expected ',' or '}', but got '<stream end>' at "
     "line 3 column 1"),
    ("# @package _global_\nstudy: {profile: bad}\nstudy: {seeds: [0]}\n",
     "conf/profile/bad.yaml is not valid YAML: key 'study' is given twice (lines 2 and 3) at "
     "line 3 column 1"),
    ("# @package _global_\nstudy: !!python/object:os.system {}\n",
     "conf/profile/bad.yaml is not valid YAML: could not determine a constructor for the tag "
     "'tag:yaml.org,2002:python/object:os.system' at line 2 column 8"),
    (b"# @package _global_\nstudy: {profile: caf\xe9}\n",
     "conf/profile/bad.yaml is not UTF-8 text (byte offset 40)"),
    ("", "conf/profile/bad.yaml is empty; a profile starts with '# @package _global_' and holds "
         "the keys it changes, at least study: {profile: bad}"),
    ("# @package _global_\n# nothing yet\n",
     "conf/profile/bad.yaml changes nothing (only comments); a profile holds the keys it "
     "changes, at least study: {profile: bad}"),
    ("study: {profile: bad}\n",
     "conf/profile/bad.yaml: its first line is 'study: {profile: bad}'; a profile starts with "
     "'# @package _global_', so that its keys are params.yaml's sections"),
    ("# @package _global_\n- study\n",
     "conf/profile/bad.yaml holds a list; expected a mapping of the sections it changes"),
    ("# @package _global_\ndefaults: [{profile: bad}]\nstudy: {profile: bad}\n",
     "conf/profile/bad.yaml: a profile cannot include files (defaults: [{'profile': 'bad'}]); "
     "write the keys it changes"),
]


@pytest.mark.parametrize("text,line", BAD_PROFILES)
def test_a_broken_profile_is_one_line_naming_the_file_before_hydra_reads_it(tmp_path, text,
                                                                          line):
    project = _project(tmp_path)
    path = project / "conf" / "profile" / "bad.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError) as err:
        profiles.compose(project, "bad")
    assert str(err.value) == line


@pytest.mark.parametrize("text,line", [
    ("", "conf/config.yaml is empty; it holds the study's defaults, every key of params.yaml "
         "(git checkout it to restore it)"),
    ("defaults:\n  - _self_\n  - profile: full\nstudy: {}\n",
     "conf/config.yaml: defaults is ['_self_', {'profile': 'full'}]; it must be [_self_, "
     "{profile: null}] (the defaults, then the profile chosen with -S profile=<name>)"),
    ("defaults: [_self_, {profile: null}]\ntrain: {lr: 1}\ntrain: {lr: 2}\n",
     "conf/config.yaml is not valid YAML: key 'train' is given twice (lines 2 and 3) at line 3 "
     "column 1"),
    ("[1, 2]\n", "conf/config.yaml holds a list; expected a mapping of params.yaml's sections"),
])
def test_a_broken_conf_config_yaml_is_one_line_naming_it(tmp_path, text, line):
    project = _project(tmp_path)
    (project / "conf" / "config.yaml").write_text(text)
    with pytest.raises(ConfigError) as err:
        profiles.compose(project)
    assert str(err.value) == line


@pytest.mark.parametrize("override,line", [
    ("~study", "override: '~study' deletes study; every key of conf/config.yaml stays in "
               "params.yaml: set a value instead"),
    ("~train.lr", "override: '~train.lr' deletes train.lr; every key of conf/config.yaml stays "
                  "in params.yaml: set a value instead"),
    ("=3", "override: '=3' names no key; write KEY=VALUE, e.g. train.lr=0.001"),
])
def test_an_override_that_deletes_or_names_no_key_is_refused(override, line):
    with pytest.raises(ConfigError) as err:
        profiles.compose(ROOT, None, [override])
    assert str(err.value) == line


def test_a_composition_without_a_key_of_the_defaults_is_refused():
    """Whatever removed it (a deletion Hydra applied, a profile's ``null`` section), a key of
    conf/config.yaml missing from the composition is named."""
    from lmablate.config.conf_files import check_nothing_deleted
    defaults = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())
    composed = yaml.safe_load(profiles.compose(ROOT))
    check_nothing_deleted(defaults, composed)
    del composed["train"]["lr"]
    with pytest.raises(ConfigError) as err:
        check_nothing_deleted(defaults, composed)
    assert str(err.value) == (
        "compose: train.lr is gone from params.yaml; every key of conf/config.yaml stays (a "
        "profile or override sets values, it does not delete keys)")
    composed["train"] = None
    with pytest.raises(ConfigError, match=r"^compose: train\.\w+ is gone from params\.yaml"):
        check_nothing_deleted(defaults, composed)


def test_lmablate_compose_refuses_a_folder_as_out_and_a_long_value_in_one_short_line(
        tmp_path, run_command):
    project = _project(tmp_path)
    (project / "out").mkdir()
    done = run_command(["lmablate", "compose", "--out", "out"], project)
    assert (done.returncode, done.stderr) == (2, "lmablate: error: compose: --out out is a "
                                                 "folder; name the file to write (default "
                                                 "params.yaml)\n")
    # a 14 KB value (the probe's was 129 KB, 20,000 seeds: Hydra's override parser takes
    # minutes on it, quadratic in the list's length; the shortening is the same)
    seeds = ",".join(map(str, range(3_000)))
    done = run_command(["lmablate", "compose", "-S", f"study.seeds=[{seeds}]"], project)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert len(done.stderr) <= 301 and done.stderr.startswith(
        "lmablate: error: params: tune.seed=1000 is not allowed; must not be one of study.seeds "
        "[0, 1, 2, 3, 4, 5, 6, 7, ...], ")
    assert (project / "params.yaml").read_text() == "kept\n"


def test_the_components_profile_runs_the_worked_examples_against_the_baseline(monkeypatch):
    """Shakespeare alone, the default's seeds and budget: the baseline, the squared ReLU FFN
    (Primer) and DyT from components/, each passing the pre-flight a stage runs first."""
    from lmablate.model.variants import preflight
    cfg = params.parse(profile_raw("components"))
    default = params.parse(profile_raw("default"))
    assert cfg.study_variants == ("baseline", "squared_relu", "dyt")
    assert list(cfg.datasets) == ["shakespeare"]
    assert cfg.seeds == default.seeds and cfg.train == default.train
    assert cfg.variants["squared_relu"] == {"ffn": "components.squared_relu:SquaredReLU"}
    assert cfg.variants["dyt"] == {"norm": "components.dyt:DyT"}
    monkeypatch.chdir(ROOT)
    for variant in cfg.study_variants:
        preflight(cfg.model_config(variant, vocab_size=65), f"variant {variant!r}")

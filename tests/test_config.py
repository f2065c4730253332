"""params.yaml validation: every bad input names its key and what is allowed."""

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from lmablate import cli
from lmablate.config import study as config
from lmablate.config import params
from lmablate.config.study import ConfigError, ModelConfig
from lmablate.core.fingerprint import NOT_A_RESULT, fingerprint
from lmablate.core.validation import from_mapping, is_param
from lmablate.tune.search_space import width_ladder

from conftest import PROFILES, profile_config, profile_raw

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def raw():
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_committed_params_are_valid(raw):
    cfg = params.parse(raw)
    assert cfg.study_variants[0] == "baseline"
    assert len(cfg.seeds) >= 3
    assert set(cfg.datasets) == {"shakespeare", "arithmetic"}
    for ds in cfg.datasets:  # every width tuning may search is valid for every variant
        for v in cfg.study_variants:
            for d in width_ladder(cfg, ds):
                m = cfg.model_config(v, vocab_size=50, d_model=d)
                assert m.d_model == d and m.vocab_size == 50


def test_seed_scale_profile_is_valid():
    cfg = profile_config("seed-scale")
    assert cfg.model.n_layers == 8 and cfg.model.n_heads == 8 and cfg.model.context_length == 128
    assert cfg.train.batch_size == 16
    assert cfg.datasets["arithmetic"].n_train == 3_000_000
    # seed 000's compute: 5000 steps at d_model 96
    from lmablate.train.budget import run_steps
    for ds in cfg.datasets:  # at the largest budget of Shakespeare's scaling study
        at = cfg.at_budget(ds, cfg.headline_budget(ds))
        assert run_steps(at, ds, cfg.model_config("baseline", 65, d_model=96)) == 5000


def test_variant_overrides_apply(raw):
    cfg = params.parse(raw)
    llama = cfg.model_config("llama", vocab_size=10)
    assert (llama.norm, llama.position, llama.ffn) == ("rmsnorm", "rope", "swiglu")
    assert cfg.model_config("baseline", vocab_size=10).ffn == "relu"


def test_position_coupled_beside_a_text_dataset_is_an_error_naming_both(raw):
    bad = mutate(raw, "study.variants", ["baseline", "coupled"])
    with pytest.raises(ConfigError, match=r"study\.variants=.*coupled \(position coupled\) needs "
                                          r"arithmetic datasets only; study\.datasets has "
                                          r"shakespeare"):
        params.parse(bad)
    cfg = params.parse(mutate(bad, "study.datasets", ["arithmetic"]))
    from lmablate.model.variants import resolve_model_config
    with pytest.raises(ConfigError, match="variant 'coupled' has position 'coupled', which needs"):
        resolve_model_config(cfg, "coupled", 20, 32, line_length=0)  # a text dataset's lines
    assert resolve_model_config(cfg, "coupled", 20, 32, line_length=21).line_length == 21
    assert resolve_model_config(cfg, "baseline", 20, 32, line_length=21).line_length == 0


@pytest.mark.parametrize("key, spelled, as_float", [
    ("train.budget_flops", {"shakespeare": 200000000000, "arithmetic": 225000000000},
     {"shakespeare": 2.0e11, "arithmetic": 2.25e11}),
    ("train.weight_decay", 0, 0.0),
    ("train.grad_clip", 1, 1.0),
    ("tune.lr_high", 1, 1.0e0),
    ("model.rope_base", 10000, 10000.0),
])
def test_a_number_spelled_as_an_integer_is_the_same_study(raw, key, spelled, as_float):
    """YAML reads 225000000000 as an int and 2.25e+11 as a float: one value, one study name."""
    from lmablate.tune.tuning import study_name
    a, b = params.parse(mutate(raw, key, spelled)), params.parse(mutate(raw, key, as_float))
    assert a == b
    names = [study_name(c, "arithmetic", "rope", "data", 0, "cpu") for c in (a, b)]
    assert names[0] == names[1]


def test_a_budget_list_has_at_most_16_budgets_and_the_error_stays_short(raw):
    many = [float(10 ** 9 * (i + 1)) for i in range(300)]
    with pytest.raises(ConfigError) as err:
        params.parse(mutate(raw, "train.budget_flops.shakespeare", many))
    message = str(err.value)
    assert message.startswith("params: train.budget_flops.shakespeare=[1000000000.0, "
                              "2000000000.0, ")
    assert message.endswith("expected a number or a list of 1 to 16 numbers (each budget is a "
                            "study of its own)")
    assert ", ...] is not allowed" in message and len(message) < 300


def mutate(raw, path, value):
    out = copy.deepcopy(raw)
    node = out
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    if value is KeyError:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return out


BAD = [
    ("train.learning_rate", 0.1, "unknown key train.learning_rate"),
    ("colour", "red", "unknown key colour"),
    ("train.lr", -1.0, "train.lr"),
    ("train.lr", 0, "train.lr"),
    ("train.steps", 300, "unknown key train.steps"),
    ("train.batch_size", "many", "train.batch_size"),
    ("train.batch_size", 2.5, "train.batch_size"),
    ("train.budget_flops", {"shakespeare": 1e12}, "missing: arithmetic"),
    ("train.budget_flops", {"shakespeare": 1e12, "arithmetic": "1.0e12"},
     "train.budget_flops.arithmetic"),
    ("train.budget_flops", {"shakespeare": 1e12, "arithmetic": -1.0},
     "train.budget_flops.arithmetic"),
    ("train.budget_flops", 1e12, "train.budget_flops"),
    ("tune.seed", 2, "must not be one of study.seeds"),
    ("tune.rungs", [[8, 0.0], [2, 1.0]], "tune.rungs"),
    ("tune.rungs", [[8, 0.5], [2, 1.5]], "tune.rungs"),
    ("tune.rungs", [[8, 0.5]], "tune.rungs"),
    ("tune.lr_limits", [1e-2, 1.0], "must contain"),
    ("tune.tokens_per_parameter", [80, 5], "tune.tokens_per_parameter"),
    ("tune.tokens_per_parameter_limits", [60, 400], "must contain"),
    ("tune.n_widths", 0, "tune.n_widths"),
    ("tune.trials_per_batch", 0, "tune.trials_per_batch"),
    ("tune.d_model_choices", [32, 32], "distinct"),
    ("tune.eta", 3, "unknown key tune.eta"),
    ("model.d_model", 66, "divisible by n_heads"),
    ("model.ffn", "swish", "model.ffn"),
    ("model.position", "relative", "model.position"),
    ("model.norm", "batchnorm", "model.norm"),
    ("model.n_kv_heads", 3, "n_kv_heads"),
    ("model.dropout", 1.5, "model.dropout"),
    ("study.seeds", [], "study.seeds"),
    ("study.seeds", [1, 1], "distinct"),
    ("study.variants", ["baseline", "mamba"], "mamba"),
    ("study.datasets", ["wikitext"], "wikitext"),
    ("variants.rope", {"position": "rope", "colour": 1}, "variants.rope.colour"),
    ("tune.d_model_choices", [32, 50], "tune.d_model_choices"),
    ("tune.lr_low", 1.0, "tune.lr_low"),
    ("tune.pruner", "median", "unknown key tune.pruner"),
    ("tune.min_steps", True, "tune.min_steps"),
    ("train.warmup_fraction", 0.6, "train.warmup_fraction"),
    ("tune.reports", 0, "tune.reports"),
    ("runtime.parallel", "mpi", "runtime.parallel"),
    ("datasets.arithmetic.n_train", 0, "n_train"),
    ("datasets.arithmetic.kind", "algebra", "kind"),
    ("datasets.shakespeare.sha256", KeyError, "sha256"),
    ("datasets.shakespeare.split", {"val": 0.6, "test": 0.5}, "split"),
    ("runtime.device", "tpu", "runtime.device"),
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[b[0] + "=" + str(b[1]) for b in BAD])
def test_bad_params_name_the_key(raw, path, value, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        params.parse(mutate(raw, path, value))


def test_rope_needs_even_head_dim():
    with pytest.raises(ConfigError, match="even head_dim"):
        ModelConfig(d_model=12, n_heads=4, position="rope")


def test_glu_hidden_size_rule():
    # 2/3 * 4 * d rounded up (to a multiple of ffn_multiple_of, default 1): d=64 -> 171
    assert ModelConfig(d_model=64, ffn="swiglu").ffn_hidden_size == 171
    assert ModelConfig(d_model=96, ffn="swiglu", ffn_multiple_of=8).ffn_hidden_size == 256
    assert ModelConfig(d_model=60, n_heads=4, ffn="swiglu", ffn_multiple_of=8).ffn_hidden_size == 160
    assert ModelConfig(d_model=64, ffn="relu").ffn_hidden_size == 256
    assert ModelConfig(d_model=64, ffn="swiglu", ffn_hidden=100).ffn_hidden_size == 100


def test_derived_fields():
    m = ModelConfig(d_model=64, n_heads=8, n_kv_heads=2)
    assert (m.head_dim, m.n_query_groups) == (8, 2)
    assert ModelConfig(d_model=64, n_heads=8).n_query_groups == 8
    assert ModelConfig(**m.to_dict()) == m


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        params.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("study: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        params.load(bad)


def test_fingerprint_changes_with_settings(raw):
    cfg = params.parse(raw)
    other = params.parse(mutate(raw, "tune.rungs", [[8, 0.25], [2, 1.0]]))
    assert fingerprint(cfg.tune) != fingerprint(other.tune)
    assert fingerprint(cfg.tune) == fingerprint(params.parse(raw).tune)


@pytest.mark.parametrize("key,value", [("tune.storage", "sqlite:///elsewhere.db"),
                                       ("tune.heartbeat_seconds", 3)])
def test_fingerprint_ignores_where_and_how_often(raw, key, value):
    cfg, other = params.parse(raw), params.parse(mutate(raw, key, value))
    assert cfg.tune != other.tune
    assert fingerprint(cfg.tune) == fingerprint(other.tune)


def test_every_result_setting_enters_the_fingerprint_and_no_runtime_setting_does(raw):
    """The rule is field metadata, not a list: each field of train/tune/model/dataset changes
    the fingerprint unless it is marked NOT_A_RESULT, and every runtime field is so marked."""
    cfg = params.parse(raw)
    assert all(NOT_A_RESULT.items() <= f.metadata.items()
               for f in dataclasses.fields(config.RuntimeConfig))
    for section in (cfg.train, cfg.tune):
        for f in dataclasses.fields(section):
            if not f.init or NOT_A_RESULT.items() <= f.metadata.items():
                continue
            value = getattr(section, f.name)
            changed = {int: lambda v: v + 1, float: lambda v: v * 0.5,
                       tuple: lambda v: v + (v[-1] * 2,),
                       dict: lambda v: {k: x * 0.5 for k, x in v.items()}}
            if isinstance(value, str):
                continue  # a choice: the numeric fields check the same rule
            # pairs and lists whose rules a generic change would break
            special = {"rungs": ((8, 0.25), (2, 1.0)), "lr_limits": (1e-6, 1.0),
                       "tokens_per_parameter": (40.0, 180.0),
                       "tokens_per_parameter_limits": (4.0, 3000.0), "d_model_choices": (32, 48),
                       "bracket_factor": 3.0}
            new = special[f.name] if f.name in special else changed[type(value)](value)
            other = dataclasses.replace(section, **{f.name: new})
            assert fingerprint(other) != fingerprint(section), f.name


def test_study_name_covers_what_a_trial_computes_and_nothing_else(raw):
    """A trial's steps follow from its dataset's budget and its rung's share, and it reports
    tune.reports times, so train.eval_interval and the other dataset's budget do not name the
    study; runtime settings never do; the data and the code do."""
    from lmablate.tune.tuning import study_name

    def name(path=None, value=None, data="d4t4", sampler_seed=0, kind="cpu AVX512"):
        cfg = params.parse(mutate(raw, path, value) if path else raw)
        return study_name(cfg, "arithmetic", "baseline", data, sampler_seed, kind)

    assert name("train.eval_interval", 7) == name("train.budget_flops.shakespeare", 1e9) == name()
    assert name("runtime.workers", 3) == name("runtime.parallel", "processes") == name()
    assert name("tune.storage", "sqlite:///x.db") == name()
    assert name("tune.reports", 7) != name()
    assert name("train.budget_flops.arithmetic", 1e9) != name()
    assert name("train.eval_iters", 3) != name()
    assert name("train.warmup_fraction", 0.2) != name()
    assert name(data="other") != name()
    assert name(sampler_seed=1) != name()
    assert name(kind="cpu AVX2") != name()  # other kernels, other trials
    assert name("runtime.cluster", "tcp://127.0.0.1:8786") == name()


@pytest.mark.parametrize("source", ["model/gpt.py", "train/training.py", "tune/tuning.py",
                                    "data/corpus.py", "tune/storage.py"])
def test_an_edited_source_file_names_a_new_study(tmp_path, source):
    """A copy of the package with a comment appended to ``source`` computes another study name
    than an unedited copy (which matches this package): the edited code starts a new study."""
    import shutil
    import subprocess
    import sys

    import lmablate

    code = ("import sys, yaml; from lmablate.config import params; "
            "from lmablate.tune.tuning import study_name; "
            "cfg = params.parse(yaml.safe_load(open(sys.argv[1]))); "
            "print(study_name(cfg, 'arithmetic', 'baseline', 'd4t4', 0, 'cpu'))")

    def name_in_copy(edit: bool) -> str:
        root = tmp_path / ("edited" if edit else "unedited")
        package = root / "lmablate"
        shutil.copytree(Path(lmablate.__file__).parent, package,
                        ignore=shutil.ignore_patterns("__pycache__"))
        if edit:
            with open(package / source, "a") as f:
                f.write("\n# an edit\n")
        check = "import lmablate, sys; sys.stdout.write(lmablate.__file__)"
        where = subprocess.run([sys.executable, "-c", check], env={"PYTHONPATH": str(root)},
                               capture_output=True, text=True, check=True).stdout
        assert Path(where).parent == package  # the copy, not the installed package
        return subprocess.run([sys.executable, "-c", code, str(ROOT / "params.yaml")],
                              env={"PYTHONPATH": str(root)}, capture_output=True, text=True,
                              check=True).stdout.strip()

    from lmablate.tune.tuning import study_name

    here = study_name(params.parse(yaml.safe_load((ROOT / "params.yaml").read_text())),
                      "arithmetic", "baseline", "d4t4", 0, "cpu")
    assert name_in_copy(edit=False) == here
    assert name_in_copy(edit=True) != here


def setting_paths(node, prefix=()):
    """Every key path of a parsed params mapping (sections, keys and nested keys)."""
    for key, value in node.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from setting_paths(value, prefix + (key,))


WRONG_KINDS = ["x", "", "false", [], [1], {}, {"a": 1}, None, float("inf"), float("nan"), -1, 0,
               True, 1e30, 2**40]


def test_any_setting_of_the_wrong_kind_is_a_config_error_never_a_crash(raw):
    """Each key of params.yaml, in turn, set to each of :data:`WRONG_KINDS`: the study parses or
    fails with a ConfigError (one line, exit 2), never with another exception (a traceback)."""
    tried = 0
    for path in setting_paths(raw):
        for value in WRONG_KINDS:
            changed = mutate(raw, ".".join(path), value)
            try:
                params.parse(changed)
            except ConfigError as exc:
                assert "\n" not in str(exc)
            tried += 1
    assert tried > 1000


# ------------------------------------------------------------ one source for every default

SETTINGS = ("model", "train", "tune", "evaluate", "tracking", "runtime", "study")


def param_fields(section):
    return [f for f in dataclasses.fields(config.SECTIONS[section]) if is_param(f)]


def default_of(f):
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


@pytest.mark.parametrize("section", SETTINGS)
def test_params_yaml_gives_every_key_at_its_dataclass_default(raw, section):
    """params.yaml lists every key of each settings section, and each value is the default of its
    field in lmablate.config.study (compared as the dataclass keeps it: lists as tuples). A default
    changed in one place only fails here; study's lists, which have no default, are given."""
    given = raw[section]
    assert set(given) == {f.name for f in param_fields(section)}, section
    kept = from_mapping(config.SECTIONS[section], given, section) if section != "study" else \
        config.StudySection(**given)
    for f in param_fields(section):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            continue  # a required key: the study's choice, not a default
        assert getattr(kept, f.name) == default_of(f), (
            f"{section}.{f.name}: params.yaml has {given[f.name]!r}, the dataclass default is "
            f"{default_of(f)!r}")


def kind_keys(kind):
    """The keys a dataset entry of ``kind`` takes: both kinds' and its own."""
    return {f.name for f in param_fields("datasets") if f.metadata.get("kind", kind) == kind}


@pytest.mark.parametrize("name", PROFILES)
def test_every_dataset_entry_gives_every_key_of_its_kind(name):
    """A dataset is an entry, not a setting: its values are its own, but none is left to a
    default unseen (an arithmetic entry without strip_newlines would keep the newlines)."""
    for ds, entry in profile_raw(name)["datasets"].items():
        assert set(entry) == kind_keys(entry["kind"]), f"{name}: datasets.{ds}"
        assert set(entry["split"]) == {f.name for f in dataclasses.fields(config.SplitConfig)}


@pytest.mark.parametrize("name", PROFILES)
def test_a_composed_profile_leaves_no_key_to_a_default(name):
    assert params.defaults_taken(profile_raw(name)) == []
    assert params.defaults_taken(yaml.safe_load((ROOT / "params.yaml").read_text())) == []


@pytest.mark.parametrize("key,shown", [
    ("tune.rungs", "[[8, 0.125], [3, 1.0]]"), ("study.seeds", "[0, 1, 2, 3, 4, 5]"),
    ("train.budget_flops", "{'shakespeare': 100000000000.0, 'arithmetic': 225000000000.0}"),
    ("runtime.cluster", "null"), ("datasets.arithmetic.length_digits", "[]"),
    ("datasets.shakespeare.max_chars", "null")])
def test_a_key_left_out_is_named_with_the_default_it_takes(raw, key, shown):
    """Each default taken is named with its value, and taken: the parsed study has it."""
    left = mutate(raw, key, KeyError)
    assert params.defaults_taken(left) == [(key, shown)]
    params.parse(left)


def test_a_section_left_out_names_each_of_its_keys(raw):
    left = mutate(raw, "evaluate", KeyError)
    taken = params.defaults_taken(left)
    assert [k for k, _ in taken] == [f"evaluate.{f.name}" for f in param_fields("evaluate")]
    assert params.parse(left) == params.parse(raw)  # params.yaml gives the defaults


def test_the_cli_says_which_defaults_a_short_profile_takes(raw, tmp_path, capsys):
    path = tmp_path / "short.yaml"
    path.write_text(yaml.safe_dump(mutate(mutate(raw, "tune.rungs", KeyError),
                                          "train.lr", KeyError)))
    assert cli.main(["--params", str(path), "generate", "nowhere", "--out", "x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[:2] == [f"lmablate: {path} gives no train.lr; taking the default 0.0003",
                       f"lmablate: {path} gives no tune.rungs; taking the default "
                       "[[8, 0.125], [3, 1.0]]"]
    assert err[2].startswith("lmablate: error: ") and len(err) == 3


@pytest.mark.parametrize("key", ["study.variants", "study.datasets", "study.seeds"])
def test_a_study_list_deleted_takes_the_default_study_s(raw, key):
    """study.variants used to default to every variant defined (13 instead of the study's 4)."""
    assert params.parse(mutate(raw, key, KeyError)) == params.parse(raw)


def test_a_key_of_the_other_kind_of_dataset_is_an_error_naming_it(raw):
    with pytest.raises(ConfigError, match=r"datasets\.shakespeare\.n_train is a key of "
                                          r"arithmetic datasets; a text dataset takes batch_size, "
                                          r"context_length, kind, max_chars, "):
        params.parse(mutate(raw, "datasets.shakespeare.n_train", 100))
    with pytest.raises(ConfigError, match=r"datasets\.arithmetic\.source is a key of text"):
        params.parse(mutate(raw, "datasets.arithmetic.source", "x.txt"))


def test_a_dataset_without_its_kind_is_an_error_naming_it(raw):
    with pytest.raises(ConfigError,
                       match=r"missing key datasets\.arithmetic\.kind; .*arithmetic, text"):
        params.parse(mutate(raw, "datasets.arithmetic.kind", KeyError))


def test_the_vocabulary_size_is_no_key_of_params_yaml(raw):
    with pytest.raises(ConfigError, match=r"unknown key model\.vocab_size"):
        params.parse(mutate(raw, "model.vocab_size", 50))

"""Every bad input a user can give, through the command: the exact one-line message, exit status
2, and not a byte written or changed. Then the files a stage reads that were damaged since they
were written: each is named, and a damaged checkpoint of a finished seed is trained again.

The handbook's "Bad input" table (docs/troubleshooting.md) is checked against :data:`CASES` (each
of its messages must be one of these), so the documented messages are the tested ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml

from lmablate import cli

from conftest import ROOT, make_project

BIN = Path(sys.executable).parent


def tune_args(dataset="arithmetic", variant="baseline", out="out", *extra):
    return ["tune", dataset, variant, "--tokens", "tokens", "--best", f"{out}/best.json",
            "--trials", f"{out}/trials.csv", *extra]


def train_args(best="out/best.json", out="out"):
    return ["train", "arithmetic", "baseline", "--tokens", "tokens", "--best", best,
            "--checkpoints", f"{out}/ck", "--history", f"{out}/h.csv", "--grad-stats",
            f"{out}/g.csv"]


def evaluate_args(out="out"):
    return ["evaluate", "arithmetic", "baseline", "--tokens", "tokens", "--raw", "raw",
            "--checkpoints", f"{out}/ck", "--metrics", f"{out}/m.json", "--examples",
            f"{out}/e.json"]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the sha256 of its bytes."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def setting(path: str, value):
    """A change of the raw params: ``path`` (dotted) set to ``value``."""
    def change(raw):
        *parents, last = path.split(".")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return change


def settings(*changes):
    """Several :func:`setting` changes, in order."""
    def change(raw):
        for one in changes:
            one(raw)
    return change


def text_edit(edit):
    """A change of params.yaml's text (what yaml.safe_dump cannot write: duplicates, bytes)."""
    edit.text = True
    return edit


def duplicate_lr(path: Path) -> None:
    text = path.read_text()
    path.write_text(text.replace("train:\n", "train:\n  lr: 0.1\n  lr: 0.2\n", 1))


def latin1(path: Path) -> None:
    path.write_bytes(path.read_bytes() + "# café\n".encode("latin-1"))


def broken_yaml(path: Path) -> None:
    path.write_text(path.read_text() + "train: [1, 2\n")


def not_a_mapping(path: Path) -> None:
    path.write_text("- study\n- model\n")


RUNGS_RULE = ("expected a list of [trials, share of the budget] pairs, e.g. [[8, 0.125], [2, "
              "1.0]]: trials whole numbers from 1 to 10,000 that do not grow, shares that grow "
              "from above 0 to exactly 1.0 at the last rung")

# (id, change of params (raw dict) or of params.yaml's text, command, the message after
# "lmablate: error: ")
CASES = [
    # booleans are true or false, never a string that Python would read as true
    ("quoted match_params", setting("study.match_params", "false"), tune_args(),
     "params: study.match_params='false' is not allowed; expected true or false (unquoted)"),
    ("quoted tracking.enabled", setting("tracking.enabled", "no"), tune_args(),
     "params: tracking.enabled='no' is not allowed; expected true or false (unquoted)"),
    ("quoted strip_newlines", setting("datasets.arithmetic.strip_newlines", "no"), tune_args(),
     "params: datasets.arithmetic.strip_newlines='no' is not allowed; expected true or false "
     "(unquoted)"),
    ("quoted bias", setting("model.bias", "false"), tune_args(),
     "params: model.bias='false' is not allowed; expected true or false (unquoted)"),
    ("number for tie_weights", setting("model.tie_weights", 1), tune_args(),
     "params: model.tie_weights=1 is not allowed; expected true or false (unquoted)"),
    ("quoted bias in a variant", setting("variants.rope", {"position": "rope", "bias": "no"}),
     tune_args(),
     "params: variants.rope.bias='no' is not allowed; expected true or false (unquoted)"),
    # numbers are numbers, finite, and below the stated limits
    ("infinite budget", setting("train.budget_flops.arithmetic", float("inf")), tune_args(),
     "params: train.budget_flops.arithmetic=inf is not allowed; expected a finite number > 0 "
     "and <= 1e+20"),
    ("budget above the limit", setting("train.budget_flops.arithmetic", 1e30), tune_args(),
     "params: train.budget_flops.arithmetic=1e+30 is not allowed; expected a finite number > 0 "
     "and <= 1e+20"),
    ("budget without the exponent's sign", setting("train.budget_flops.arithmetic", "1.0e12"),
     tune_args(), "params: train.budget_flops.arithmetic='1.0e12' is not allowed; expected a "
     "finite number > 0 and <= 1e+20"),
    ("budget not a mapping", setting("train.budget_flops", 1e12), tune_args(),
     "params: train.budget_flops=1000000000000.0 is not allowed; expected a mapping"),
    ("infinite lr_high", setting("tune.lr_high", float("inf")), tune_args(),
     "params: tune.lr_high=inf is not allowed; expected a finite number"),
    ("NaN learning rate", setting("train.lr", float("nan")), tune_args(),
     "params: train.lr=nan is not allowed; expected a finite number"),
    ("zero learning rate", setting("train.lr", 0), tune_args(),
     "params: train.lr=0 is not allowed; expected a finite number > 0"),
    ("quoted rung share", setting("tune.rungs", [[2, "0.5"], [1, 1.0]]), tune_args(),
     "params: tune.rungs=[[2, '0.5'], [1, 1.0]] is not allowed; " + RUNGS_RULE),
    ("rungs that stop short of the full budget", setting("tune.rungs", [[8, 0.25], [2, 0.5]]),
     tune_args(), "params: tune.rungs=[[8, 0.25], [2, 0.5]] is not allowed; " + RUNGS_RULE),
    ("rungs that grow", setting("tune.rungs", [[2, 0.5], [4, 1.0]]), tune_args(),
     "params: tune.rungs=[[2, 0.5], [4, 1.0]] is not allowed; " + RUNGS_RULE),
    ("hard limits that do not hold the lr range", setting("tune.lr_limits", [1e-2, 1.0]),
     tune_args(), "params: tune.lr_limits=[0.01, 1.0] is not allowed; must contain "
     "[tune.lr_low, tune.lr_high] = [0.001, 0.1]"),
    ("tokens per parameter reversed", setting("tune.tokens_per_parameter", [80, 5]), tune_args(),
     "params: tune.tokens_per_parameter=[80, 5] is not allowed; expected [low, high] with 0 < "
     "low < high <= 1e+06"),
    ("a lowest rung too short to leave its warm-up", setting("tune.min_steps", 1000),
     tune_args(), "params: train.budget_flops.arithmetic={budget} x tune.rungs[0] share 0.5 "
     "buys 2 steps of a tuning trial at d_model=16; allowed: at least tune.min_steps=1000 steps "
     "(a larger share at the first of tune.rungs, a larger budget, or narrower widths)"),
    ("quoted norm_eps in a variant", setting("variants.rope", {"position": "rope",
                                                              "norm_eps": "1e-5"}),
     tune_args(), "params: variants.rope.norm_eps='1e-5' is not allowed; expected a finite number"),
    ("infinite rope_base", setting("model.rope_base", float("inf")), tune_args(),
     "params: model.rope_base=inf is not allowed; expected a finite number"),
    ("NaN dropout", setting("model.dropout", float("nan")), tune_args(),
     "params: model.dropout=nan is not allowed; expected a finite number"),
    ("dropout of 1.5", setting("model.dropout", 1.5), tune_args(),
     "params: model.dropout=1.5 is not allowed; expected a number in [0, 1)"),
    ("beta2 of 1", setting("train.beta2", 1.0), tune_args(),
     "params: train.beta2=1.0 is not allowed; expected a number in [0, 1)"),
    ("negative warm-up", setting("train.warmup_fraction", -0.1), tune_args(),
     "params: train.warmup_fraction=-0.1 is not allowed; expected a finite number >= 0 and <= "
     "0.5"),
    ("warm-up longer than half a run", setting("train.warmup_fraction", 0.8), tune_args(),
     "params: train.warmup_fraction=0.8 is not allowed; expected a finite number >= 0 and <= "
     "0.5"),
    ("word for grad_clip", setting("train.grad_clip", "none"), tune_args(),
     "params: train.grad_clip='none' is not allowed; expected a finite number"),
    ("NaN tokens per parameter", setting("tune.tokens_per_parameter", [5, float("nan")]),
     tune_args(), "params: tune.tokens_per_parameter=[5, nan] is not allowed; expected [low, "
     "high] with 0 < low < high <= 1e+06"),
    ("word for batch_size", setting("train.batch_size", "many"), tune_args(),
     "params: train.batch_size='many' is not allowed; expected an integer"),
    ("fractional batch_size", setting("train.batch_size", 2.5), tune_args(),
     "params: train.batch_size=2.5 is not allowed; expected an integer"),
    ("batch_size above the limit", setting("train.batch_size", 100_000), tune_args(),
     "params: train.batch_size=100000 is not allowed; expected an integer >= 1 and <= 4,096"),
    ("zero digits", setting("datasets.arithmetic.digits", 0), tune_args(),
     "params: datasets.arithmetic.digits=0 is not allowed; expected an integer >= 1 and <= 7"),
    ("no operations", setting("datasets.arithmetic.operations", []), tune_args(),
     "params: datasets.arithmetic.operations=[] is not allowed; a non-empty list of '+', '-', "
     "'*', '/'"),
    ("an unknown operation", setting("datasets.arithmetic.operations", ["+", "^"]), tune_args(),
     "params: datasets.arithmetic.operations=['+', '^'] is not allowed; each of '+', '-', '*', "
     "'/' at most once"),
    ("max_operand beyond its digits", setting("datasets.arithmetic.max_operand", 1000),
     tune_args(), "params: datasets.arithmetic.max_operand=1000 is not allowed; expected an "
     "integer >= 10 and <= 100"),
    ("a length split no longer than training", setting("datasets.arithmetic.length_digits", [2]),
     tune_args(), "params: datasets.arithmetic.length_digits=2 is not allowed; expected an "
     "integer >= 3 and <= 7"),
    ("problems longer than the context", setting("datasets.arithmetic.decimals", True),
     tune_args(), "params: datasets.arithmetic={'digits': 2, 'max_operand': 99, 'decimals': "
     "True, 'operations': ['+', '-'], 'lengt... is not allowed; its problems are 30 characters "
     "(fields of 8), more than model.context_length=24 holds; fewer digits, fewer decimals, no "
     "length split or a longer context"),  # at 300 characters: the value shortened
    ("n_test above the limit", setting("datasets.arithmetic.n_test", 10_000_000_000),
     tune_args(), "params: datasets.arithmetic.n_test=10000000000 is not allowed; expected an "
     "integer >= 1 and <= 10,000,000"),
    ("n_train of 0", setting("datasets.arithmetic.n_train", 0), tune_args(),
     "params: datasets.arithmetic.n_train=0 is not allowed; expected an integer >= 1 and <= "
     "10,000,000"),
    ("negative dataset seed", setting("datasets.arithmetic.seed", -1), tune_args(),
     "params: datasets.arithmetic.seed=-1 is not allowed; expected an integer >= 0 and <= "
     "2,147,483,647"),
    ("max_problems above the limit", setting("evaluate.max_problems", 10**8), tune_args(),
     "params: evaluate.max_problems=100000000 is not allowed; expected an integer >= 1 and <= "
     "10,000,000"),
    ("context_length above the limit", setting("model.context_length", 100_000), tune_args(),
     "params: model.context_length=100000 is not allowed; expected an integer >= 1 and <= 8,192"),
    ("n_layers above the limit", setting("model.n_layers", 1000), tune_args(),
     "params: model.n_layers=1000 is not allowed; expected an integer >= 1 and <= 128"),
    ("float n_kv_heads", setting("model.n_kv_heads", 2.0), tune_args(),
     "params: model.n_kv_heads=2.0 is not allowed; expected an integer or null"),
    ("trials above the limit", setting("tune.rungs", [[10**6, 0.5], [1, 1.0]]), tune_args(),
     "params: tune.rungs=[[1000000, 0.5], [1, 1.0]] is not allowed; " + RUNGS_RULE),
    ("sampler_seed above the limit", setting("tune.sampler_seed", 2**31), tune_args(),
     "params: tune.sampler_seed=2147483648 is not allowed; expected an integer >= 0 and <= "
     "2,147,483,647"),
    ("a replicate's seed above the limit",
     settings(setting("study.seeds", [2**31 - 1]), setting("study.replicates", 2),
              setting("study.replicate_stages", [1])),
     tune_args("arithmetic", "baseline", "out", "--replicate", "1"),
     "params: study.replicates=2 is not allowed; replicate 1 would draw seed 2,147,583,647, "
     "above 2,147,483,647; lower study.seeds, tune.seed or tune.sampler_seed"),
    ("a variant listed twice", setting("study.variants", ["baseline", "rope", "baseline"]),
     tune_args(), "params: study.variants=['baseline', 'rope', 'baseline'] is not allowed; "
     "each name once (baseline given more than once)"),
    ("a dataset listed twice", setting("study.datasets", ["arithmetic", "arithmetic"]),
     tune_args(), "params: study.datasets=['arithmetic', 'arithmetic'] is not allowed; each "
     "name once (arithmetic given more than once)"),
    ("a replicate's sampler seed above the limit",
     settings(setting("tune.sampler_seed", 2**31 - 1), setting("study.replicates", 2),
              setting("study.replicate_stages", [1])),
     tune_args("arithmetic", "baseline", "out", "--replicate", "1"),
     "params: study.replicates=2 is not allowed; replicate 1 would draw seed 2,147,483,648, "
     "above 2,147,483,647; lower study.seeds, tune.seed or tune.sampler_seed"),
    ("a replicate the study does not have", setting("study.replicates", 1),
     tune_args("arithmetic", "baseline", "out", "--replicate", "1"),
     "params: --replicate=1 is not allowed; a replicate of the study, 0 .. "
     "study.replicates - 1 = 0"),
    ("replicate stages that do not match", setting("study.replicates", 3), tune_args(),
     "params: study.replicate_stages=[] is not allowed; must be [1, 2] for "
     "study.replicates=3 (one stage per replicate after the first)"),
    ("negative workers", setting("runtime.workers", -1), tune_args(),
     "params: runtime.workers=-1 is not allowed; expected an integer >= 0 and <= 1,024"),
    ("workers above the limit", setting("runtime.workers", 5000), tune_args(),
     "params: runtime.workers=5000 is not allowed; expected an integer >= 0 and <= 1,024"),
    ("extrapolation factor above the limit", setting("evaluate.extrapolation_factors", [1, 1000]),
     tune_args(), "params: evaluate.extrapolation_factors=1000 is not allowed; expected an "
     "integer >= 1 and <= 64"),
    ("extrapolation factors not a list", setting("evaluate.extrapolation_factors", 4),
     tune_args(), "params: evaluate.extrapolation_factors=4 is not allowed; expected a list, e.g. "
     "[1, 2]"),
    # lists, strings and mappings where they belong
    ("d_model_choices not a list", setting("tune.d_model_choices", 32), tune_args(),
     "params: tune.d_model_choices=32 is not allowed; expected a list, e.g. [1, 2]"),
    ("empty d_model_choices", setting("tune.d_model_choices", []), tune_args(),
     "params: tune.d_model_choices=[] is not allowed; expected a non-empty list, or null to "
     "derive the widths from the budget"),
    ("seeds as a string", setting("study.seeds", "0, 1"), tune_args(),
     "params: study.seeds='0, 1' is not allowed; expected a non-empty list of integers"),
    ("fractional seed", setting("study.seeds", [0.5]), tune_args(),
     "params: study.seeds=0.5 is not allowed; expected an integer >= 0 and <= 2,147,483,647"),
    ("seed above the limit", setting("study.seeds", [0, 2**31]), tune_args(),
     "params: study.seeds=2147483648 is not allowed; expected an integer >= 0 and <= "
     "2,147,483,647"),
    ("empty seeds", setting("study.seeds", []), tune_args(),
     "params: study.seeds=[] is not allowed; expected a non-empty list of integers"),
    ("repeated seeds", setting("study.seeds", [1, 1]), tune_args(),
     "params: study.seeds=[1, 1] is not allowed; seeds must be distinct"),
    ("experiment as a number", setting("tracking.experiment", 123), tune_args(),
     "params: tracking.experiment=123 is not allowed; expected a non-empty string"),
    ("empty tracking uri", setting("tracking.uri", ""), tune_args(),
     "params: tracking.uri='' is not allowed; expected a non-empty string"),
    ("storage as a number", setting("tune.storage", 5), tune_args(),
     "params: tune.storage=5 is not allowed; expected a non-empty string"),
    ("source as a number", setting("datasets.shakespeare.source", 5), tune_args(),
     "params: datasets.shakespeare.source=5 is not allowed; expected a non-empty string"),
    ("split as a string", setting("datasets.arithmetic.split", "0.1"), tune_args(),
     "params: datasets.arithmetic.split='0.1' is not allowed; expected a mapping"),
    ("variants as a list", setting("variants", ["baseline"]), tune_args(),
     "params: variants=['baseline'] is not allowed; expected a mapping of variant name -> "
     "model overrides"),
    ("word for a variant's n_layers", setting("variants.rope", {"position": "rope",
                                                                "n_layers": "2"}),
     tune_args(), "params: variants.rope.n_layers='2' is not allowed; expected an integer"),
    # names, keys and choices
    ("variant name with a space", setting("variants.my variant", {"ffn": "gelu"}), tune_args(),
     "params: variants='my variant' is not allowed; a variant needs a name of 1 to 64 letters, "
     "digits and _ that does not start with a digit (it names DVC stages, folders and MLflow "
     "runs)"),
    ("variant name of 300 characters", setting("variants." + "v" * 300, {"ffn": "gelu"}),
     tune_args(), "params: variants='" + "v" * 37 + "..." + "v" * 38 + "' is not allowed; a "
     "variant needs a name "
     "of 1 to 64 letters, digits and _ that does not start with a digit (it names DVC stages, "
     "folders and MLflow runs)"),
    ("dataset name with a hyphen", setting("datasets.my-data", {"kind": "arithmetic"}),
     tune_args(), "params: datasets='my-data' is not allowed; a dataset needs a name of 1 to 64 "
     "letters, digits and _ that does not start with a digit (it names DVC stages, folders and "
     "MLflow runs)"),

    ("a variant overriding the tuned width", setting("variants.wide", {"d_model": 64}),
     tune_args(), "params: variants.wide.d_model=64 is not allowed; the width is tuned for every "
     "variant from tune.d_model_choices (give that a single value to fix it)"),
    ("an MLflow experiment of 600 characters", setting("tracking.experiment", "x" * 600),
     tune_args(), "params: tracking.experiment='" + "x" * 37 + "..." + "x" * 38 + "' is not "
     "allowed; a string of 1 to 200 characters"),
    ("unknown key", setting("train.epochs", 3), tune_args(),
     "params: unknown key train.epochs; allowed keys under train: batch_size, beta1, beta2, "
     "budget_flops, eval_interval, eval_iters, grad_clip, lr, lr_schedule, warmup_fraction, "
     "weight_decay"),
    ("unknown section", setting("optimiser", {"lr": 1}), tune_args(),
     "params: unknown key optimiser; allowed: study, datasets, model, variants, train, tune, "
     "evaluate, tracking, runtime"),
    ("unknown component", setting("variants.rope", {"position": "spiral"}), tune_args(),
     "params: model.position='spiral' is not allowed; choose one of learned, sinusoidal, rope, "
     "alibi, none, coupled, or components.<module>:<Class> (a class of the project's "
     "components/<module>.py) (in variants.rope)"),
    ("unknown variant in the study", setting("study.variants", ["baseline", "mamba"]),
     tune_args(), "params: study.variants='mamba' is not allowed; choose from alibi, baseline, coupled, "
     "geglu, gelu, gqa, llama, mqa, nope, post_norm, rmsnorm, rope, sinusoidal, swiglu"),
    ("unknown variant on the command line", None, tune_args("arithmetic", "mamba"),
     "params: variant='mamba' is not allowed; choose one of alibi, baseline, coupled, geglu, gelu, "
     "gqa, llama, mqa, nope, post_norm, rmsnorm, rope, sinusoidal, swiglu"),
    ("unknown dataset on the command line", None, tune_args("wikitext"),
     "params: dataset='wikitext' is not allowed; choose one of arithmetic"),
    ("width not divisible by the heads", setting("model.d_model", 9), tune_args(),
     "params: model.d_model=9 is not allowed; must be divisible by n_heads=2"),
    ("kv heads not dividing the heads", setting("model.n_kv_heads", 3), tune_args(),
     "params: model.n_kv_heads=3 is not allowed; must divide n_heads=2"),
    ("tuning seed among the final seeds", setting("tune.seed", 0), tune_args(),
     "params: tune.seed=0 is not allowed; must not be one of study.seeds [0], nor the next "
     "tune.bracket_seeds=1 - 1 seeds after it: a final seed would then have been seen by "
     "tuning"),
    ("a bracket's second tuning seed among the final seeds",
     settings(setting("tune.seed", 1000), setting("tune.bracket_seeds", 2),
              setting("study.seeds", [1001])), tune_args(),
     "params: tune.seed=1000 is not allowed; must not be one of study.seeds [1001], nor the "
     "next tune.bracket_seeds=2 - 1 seeds after it: a final seed would then have been seen by "
     "tuning"),
    ("a budget too small for one step", setting("train.budget_flops.arithmetic", 1000),
     tune_args(), "params: train.budget_flops.arithmetic=1e+03 x tune.rungs[0] share 0.5 buys "
     "no tuning trial of d_model=16 (2.13e+06 FLOPs for 1 step(s)); allowed: a larger budget"),
    ("a dataset without a budget", setting("train.budget_flops", {"shakespeare": 3e11}),
     tune_args(), "params: train.budget_flops={'shakespeare': 300000000000.0} is not allowed; "
     "give a budget for every dataset of the study (missing: arithmetic)"),
    ("splits that leave no training data",
     setting("datasets.shakespeare.split", {"val": 0.6, "test": 0.5}), tune_args(),
     "params: split=(0.6, 0.5) is not allowed; val + test must leave a training split (in "
     "datasets.shakespeare)"),
    ("a download without its sha256", setting("datasets.shakespeare.sha256", None), tune_args(),
     "params: datasets.shakespeare.sha256=None is not allowed; a download needs its sha256"),
    ("a tuned width not divisible by the heads", setting("tune.d_model_choices", [16, 9]),
     tune_args(), "params: tune.d_model_choices=9 is not allowed; every width must be divisible "
     "by n_heads=2"),
    # the file itself
    ("a duplicate key", text_edit(duplicate_lr), tune_args(),
     "params: params.yaml is not valid YAML: duplicate key 'lr' (given first at line {lr}; a "
     "key may appear once in a mapping) at line {lr2}, column 3"),
    ("latin-1 params", text_edit(latin1), tune_args(),
     "params: params.yaml is not UTF-8 text: byte 0xe9 at byte offset {offset}"),
    ("broken YAML", text_edit(broken_yaml), tune_args(),
     "params: params.yaml is not valid YAML: while parsing a flow sequence: expected ',' or ']', "
     "but got '<stream end>' at line {end}, column 1"),
    ("params not a mapping", text_edit(not_a_mapping), tune_args(),
     "params: the file must hold a mapping of sections"),
    ("missing params file", None, ["--params", "nowhere.yaml", *tune_args()],
     "params: file nowhere.yaml not found"),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny project, made once; each case works on its own copy."""
    return make_project(tmp_path_factory.mktemp("base")).path


def copy_of(base: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "p"
    shutil.copytree(base, dest)
    return dest


@pytest.mark.parametrize("name,change,argv,message", CASES, ids=[c[0] for c in CASES])
def test_a_bad_input_exits_2_with_its_one_line_and_writes_nothing(
        base, tmp_path, monkeypatch, capsys, name, change, argv, message):
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)
    params = project / "params.yaml"
    if getattr(change, "text", False):
        change(params)
    elif change is not None:
        raw = yaml.safe_load(params.read_text())
        change(raw)
        params.write_text(yaml.safe_dump(raw))
    lines = params.read_text(errors="replace").splitlines()
    first_lr = lines.index("train:") + 2 if "train:" in lines else 0
    budget = yaml.safe_load((base / "params.yaml").read_text())["train"]["budget_flops"][
        "arithmetic"]
    for field, value in {"offset": len(params.read_bytes()) - 2, "end": len(lines) + 1,
                         "lr": first_lr, "lr2": first_lr + 1,
                         "budget": f"{budget:.3g}"}.items():
        message = message.replace(f"{{{field}}}", str(value))
    before = snapshot(project)
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"lmablate: error: {message}\n"
    assert snapshot(project) == before


def test_a_yaml_alias_bomb_is_refused_at_once_in_one_short_line(base, tmp_path, monkeypatch,
                                                               capsys):
    """9 levels of 9 aliases: 387 million ones if printed in full (a probe's message was 671 MB
    after 39 s); the value is cut so that the line, the rule whole, stays within 300
    characters."""
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["tune"]["rungs"] = "BOMB"
    levels = ["&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + [
        f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = yaml.safe_dump(raw).replace("rungs: BOMB", "rungs: [" + ", ".join(levels) + "]")
    assert "&a8 [*a7" in text
    (project / "params.yaml").write_text(text)
    before = snapshot(project)
    start = time.perf_counter()
    assert cli.main(tune_args()) == 2
    assert time.perf_counter() - start < 10
    err = capsys.readouterr().err
    assert err.startswith("lmablate: error: params: tune.rungs=([1, 1, ")
    assert err.endswith(f"... is not allowed; {RUNGS_RULE}\n")
    assert err.count("\n") == 1 and len(err) <= 301
    assert snapshot(project) == before


@pytest.mark.parametrize("where,what", [("folder", "is a folder"),
                                        ("/dev/null", "is no regular file (a device or a pipe)")])
def test_params_that_are_no_file_are_named_as_such(base, tmp_path, monkeypatch, capsys, where,
                                                    what):
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)
    path = "folder" if where == "folder" else "/dev/null"
    if where == "folder":
        (project / "folder").mkdir()
    before = snapshot(project)
    assert cli.main(["--params", path, *tune_args()]) == 2
    assert capsys.readouterr().err == (f"lmablate: error: params: {path} {what}; --params names "
                                       "a params.yaml file\n")
    assert snapshot(project) == before


def test_a_budget_that_buys_no_width_names_the_budget(base, tmp_path, monkeypatch, capsys):
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["tune"]["d_model_choices"] = None  # widths derived from the budget
    raw["train"]["budget_flops"]["arithmetic"] = 1.0e6
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    before = snapshot(project)
    assert cli.main(tune_args()) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmablate: error: tune arithmetic: train.budget_flops.arithmetic=1e+06 "
                          "buys no width: none is a multiple of 2 x n_heads with tokens per "
                          "parameter within tune.tokens_per_parameter_limits=")
    assert err.endswith(" steps at the lowest rung; a larger budget, or wider limits\n")
    assert snapshot(project) == before


def test_the_case_table_has_at_least_sixty_distinct_inputs():
    assert len({c[0] for c in CASES}) == len(CASES) >= 60


DEVICE_MESSAGE = ("params: runtime.device='cuda' is not allowed; {why} on this machine; use auto "
                  "or cpu")


# --- preconditions that are not params ---------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_device_the_machine_lacks_exits_2_before_any_trial(base, tmp_path, monkeypatch,
                                                             capsys):
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["runtime"]["device"] = "cuda"
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    before = snapshot(project)
    why = ("no CUDA device is visible" if torch.backends.cuda.is_built()
           else f"torch {torch.__version__} is built without CUDA")
    for argv in (tune_args(), train_args(), evaluate_args()):
        assert cli.main(argv) == 2
        assert capsys.readouterr().err == f"lmablate: error: {DEVICE_MESSAGE}\n".replace(
            "{why}", why)
    assert snapshot(project) == before


def test_a_file_where_an_output_folder_must_be_exits_2_before_any_work(base, tmp_path,
                                                                       monkeypatch, capsys):
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)
    (project / "blocker").write_text("not a folder")
    before = snapshot(project)
    assert cli.main(tune_args(out="blocker/runs")) == 2
    assert capsys.readouterr().err == (
        "lmablate: error: cannot write blocker/runs/best.json: blocker is a file, not a folder\n")
    assert snapshot(project) == before


WRONG_KIND = [  # (argv, the path to make of the wrong kind, is it made a folder, the option)
    (["generate", "arithmetic", "--out", "made"], "made", False, "out"),
    (["tokenize", "arithmetic", "--raw", "raw", "--out", "made"], "made", False, "out"),
    (tune_args()[:5] + ["--best", "made", "--trials", "out/t.csv"], "made", True, "best"),
    (train_args()[:7] + ["--checkpoints", "made"] + train_args()[9:], "made", False,
     "checkpoints"),
    (evaluate_args()[:9] + ["--metrics", "made", "--examples", "out/e.json"], "made", True,
     "metrics"),
    (["report", "--runs", "runs", "--tokens", "tokens", "--out", "made"], "made", False, "out"),
]


@pytest.mark.parametrize("argv,path,folder,opt", WRONG_KIND, ids=[c[0][0] for c in WRONG_KIND])
def test_an_output_path_of_the_wrong_kind_exits_2_before_any_work(
        base, tmp_path, monkeypatch, capsys, argv, path, folder, opt):
    """A file where a stage writes a folder, or a folder where it writes a file: refused with
    the option and the path, before anything is read or written."""
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)
    if folder:
        (project / path).mkdir()
    else:
        (project / path).write_text("a file")
    before = snapshot(project)
    assert cli.main(argv) == 2
    kind, other = ("folder", "file") if folder else ("file", "folder")
    assert capsys.readouterr().err == (f"lmablate: error: cannot write --{opt} {path}: it is a "
                                       f"{kind}; --{opt} names the {other} the stage writes\n")
    assert snapshot(project) == before


def test_an_os_error_met_during_the_work_is_one_line_and_exit_1(base, tmp_path, monkeypatch,
                                                                capsys):
    """A disk that fills mid-run (here /dev/full, which refuses every write with ENOSPC):
    one line with the reason and what to do, no traceback."""
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)

    def fill_the_disk(cfg, args):
        with open("/dev/full", "w") as full:
            full.write("x")
            full.flush()

    from lmablate.stages import generate
    monkeypatch.setattr(generate, "main", fill_the_disk)
    assert cli.main(["generate", "arithmetic", "--out", "raw2"]) == 1
    assert capsys.readouterr().err == (
        "lmablate: error: No space left on device (ENOSPC); free some space and run the same "
        "command again: it resumes\n")


def test_an_os_error_names_its_path_and_errno():
    from lmablate.core.fileio import os_error_line
    with pytest.raises(OSError) as err:
        open("/nonexistent-lmablate/x.json")
    assert os_error_line(err.value) == ("/nonexistent-lmablate/x.json: No such file or directory "
                                        "(ENOENT)")
    assert os_error_line(OSError(13, "Permission denied", "a", None, "b")) == (
        "a -> b: Permission denied (EACCES)")


def _corrupt_database(path: Path) -> None:
    """A real SQLite file of a few pages, then random bytes over one of its inner pages."""
    import sqlite3
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (x TEXT)")
        db.executemany("INSERT INTO t VALUES (?)", [("x" * 500,)] * 200)
        db.commit()
    with open(path, "r+b") as f:
        f.seek(4096 * 3)
        f.write(random.Random(0).randbytes(4096))


@pytest.mark.parametrize("store,argv", [
    ("mlflow.db", ["report", "--runs", "runs", "--tokens", "tokens", "--out", "reports"]),
    ("optuna.db", tune_args()),
])
@pytest.mark.parametrize("damage", ["random bytes", "a damaged page"])
def test_a_store_that_fails_sqlite_s_integrity_check_exits_2_before_any_work(
        base, tmp_path, monkeypatch, capsys, store, argv, damage):
    project = copy_of(base, tmp_path)
    monkeypatch.chdir(project)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("LMABLATE_OPTUNA_STORAGE", raising=False)
    raw = yaml.safe_load((project / "params.yaml").read_text())
    raw["tracking"]["enabled"] = True
    raw["tracking"]["uri"] = "sqlite:///mlflow.db"
    raw["tune"]["storage"] = "sqlite:///optuna.db"
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    if damage == "random bytes":
        (project / store).write_bytes(random.Random(1).randbytes(20000))
        why = "file is not a database"
    else:
        _corrupt_database(project / store)
        why = "database disk image is malformed"
    before = snapshot(project)
    assert cli.main(argv) == 2
    key = ("tracking.uri (MLFLOW_TRACKING_URI)" if store == "mlflow.db"
           else "tune.storage (LMABLATE_OPTUNA_STORAGE)")
    err = capsys.readouterr().err
    assert err.startswith(f"lmablate: error: {key}: {store} fails SQLite's integrity check "
                          f"({why}"), err
    assert err.endswith("); move it away (a new store is made) or restore it from a backup\n")
    assert err.count("\n") == 1 and len(err) < 400
    assert snapshot(project) == before


def _as_user(tmp_path: Path) -> tuple[list[str], Path]:
    """The command prefix that runs as an unprivileged user (root writes into any folder
    whatever its mode) and a folder it can read."""
    if os.geteuid() != 0:
        return [], tmp_path
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to drop root")
    where = Path(tempfile.mkdtemp(prefix="lmablate-ro-"))  # a tree the user can read
    os.chmod(where, 0o755)
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"], where


@pytest.mark.parametrize("read_only,argv,line", [
    ("out", tune_args(), "cannot write out/best.json: folder out is not writable"),
    # a folder below the one named: the seed folder of a checkpoint the stage replaces
    ("out/ck/seed_0", train_args(), "cannot write out/ck: folder out/ck/seed_0 is not writable"),
])
def test_a_read_only_output_folder_at_any_depth_exits_2_before_any_work(
        trained, tmp_path, read_only, argv, line):
    as_user, where = _as_user(tmp_path)
    try:
        project = where / "p"
        shutil.copytree(trained, project)
        os.chmod(project / read_only, 0o555)
        for path in [project, *project.rglob("*")]:
            if path.is_dir() and path != project / read_only:
                os.chmod(path, 0o777)
            elif path.is_file():
                os.chmod(path, 0o644)
        (project / "optuna.db").chmod(0o666)
        before = snapshot(project)
        proc = subprocess.run([*as_user, str(BIN / "lmablate"), *argv], cwd=project,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == f"lmablate: error: {line} (Permission denied)\n"
        assert snapshot(project) == before
    finally:
        if where != tmp_path:
            shutil.rmtree(where, ignore_errors=True)


def test_training_without_room_for_its_checkpoints_exits_2_before_any_work(
        trained, tmp_path, monkeypatch, capsys):
    project = copy_of(trained, tmp_path)
    monkeypatch.chdir(project)
    shutil.rmtree(project / "out" / "ck")
    usage = shutil.disk_usage(project)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=100_000))
    before = snapshot(project)
    assert cli.main(train_args()) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"lmablate: error: cannot write out/ck: 1 checkpoint needs about "
                        r"\d\.\d MB and out has 0\.1 MB free\n", err), err
    assert snapshot(project) == before


# --- files damaged after they were written -----------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A tiny project tuned and trained once (out/best.json, out/ck/seed_0/...)."""
    project = make_project(tmp_path_factory.mktemp("trained")).path
    cwd = os.getcwd()
    os.chdir(project)
    try:
        assert cli.main(tune_args()) == 0
        assert cli.main(train_args()) == 0
    finally:
        os.chdir(cwd)
    return project


def test_a_truncated_best_json_is_named(trained, tmp_path, monkeypatch, capsys):
    project = copy_of(trained, tmp_path)
    monkeypatch.chdir(project)
    best = project / "out" / "best.json"
    best.write_bytes(best.read_bytes()[:40])
    shutil.rmtree(project / "out" / "ck")
    before = snapshot(project)
    assert cli.main(train_args()) == 2
    err = capsys.readouterr().err
    assert re.fullmatch(r"lmablate: error: out/best\.json is not valid JSON \(.+ at line \d+ "
                        r"column \d+\); the file is truncated or corrupted: delete it and run "
                        r"the stage that writes it again\n", err), err
    assert snapshot(project) == before


def test_a_missing_best_json_is_named(trained, tmp_path, monkeypatch, capsys):
    project = copy_of(trained, tmp_path)
    monkeypatch.chdir(project)
    (project / "out" / "best.json").unlink()
    before = snapshot(project)
    assert cli.main(train_args()) == 2
    assert capsys.readouterr().err == "lmablate: error: file out/best.json not found\n"
    assert snapshot(project) == before


def test_evaluate_refuses_a_truncated_checkpoint_naming_it(trained, tmp_path, monkeypatch,
                                                          capsys):
    project = copy_of(trained, tmp_path)
    monkeypatch.chdir(project)
    ckpt = project / "out" / "ck" / "seed_0" / "checkpoint.pt"
    os.truncate(ckpt, 1000)
    before = snapshot(project)
    assert cli.main(evaluate_args()) == 2
    assert capsys.readouterr().err == (
        "lmablate: error: out/ck/seed_0/checkpoint.pt (1,000 bytes) does not match the sha256 "
        "recorded when it was written (truncated or changed since); run lmablate train "
        "arithmetic baseline (or dvc repro) again to retrain seed 0\n")
    assert snapshot(project) == before


@pytest.mark.parametrize("damage", ["truncated checkpoint", "missing checkpoint",
                                    "truncated result.json", "no recorded sha256"])
def test_train_retrains_a_finished_seed_whose_files_cannot_be_trusted_to_the_same_bytes(
        trained, tmp_path, monkeypatch, capsys, damage):
    project = copy_of(trained, tmp_path)
    monkeypatch.chdir(project)
    seed_dir = project / "out" / "ck" / "seed_0"
    good = snapshot(seed_dir)
    ckpt, result = seed_dir / "checkpoint.pt", seed_dir / "result.json"
    if damage == "truncated checkpoint":
        os.truncate(ckpt, 1000)
        said = ("out/ck/seed_0/checkpoint.pt (1,000 bytes) does not match the sha256 recorded "
                "when it was written (truncated or changed since)")
    elif damage == "missing checkpoint":
        ckpt.unlink()
        said = "out/ck/seed_0/checkpoint.pt is missing"
    elif damage == "truncated result.json":
        result.write_bytes(result.read_bytes()[:100])
        said = None  # its JSON error, checked by pattern below
    else:
        result.write_text(re.sub(r'\s*"checkpoint_sha256": "[0-9a-f]+",', "", result.read_text()))
        said = "out/ck/seed_0/checkpoint.pt has no recorded sha256 to check it against"
    assert cli.main(train_args()) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    if said is None:
        assert re.fullmatch(r"lmablate: out/ck/seed_0/result\.json is not valid JSON .+; "
                            r"training arithmetic/baseline seed 0 again", err[0]), err
    else:
        assert err[0] == f"lmablate: {said}; training arithmetic/baseline seed 0 again"
    # retrained from scratch to the very same bytes (result.json differs in timings only)
    assert snapshot(seed_dir)["checkpoint.pt"] == good["checkpoint.pt"]
    assert cli.main(evaluate_args()) == 0


def test_train_keeps_a_finished_seed_whose_checkpoint_is_intact(trained, tmp_path, monkeypatch,
                                                                capsys):
    project = copy_of(trained, tmp_path)
    monkeypatch.chdir(project)
    before = snapshot(project / "out" / "ck")
    assert cli.main(train_args()) == 0
    assert capsys.readouterr().err == ""
    assert snapshot(project / "out" / "ck") == before


# --- the handbook's table ----------------------------------------------------------------------

def readme_messages() -> list[str]:
    """The messages of the handbook's "Bad input" table (docs/troubleshooting.md): its second
    column, without backticks."""
    text = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    section = text.split("\n## Bad input\n", 1)[1].split("\n## ", 1)[0]
    cells = [line.strip().strip("|").split(" | ")[-1].strip() for line in section.splitlines()
             if line.startswith("| ")]
    return [c[1:-1] for c in cells if len(c) > 2 and c[0] == c[-1] == "`"]


def test_every_params_message_in_the_handbook_is_one_of_the_tested_cases():
    documented = [m for m in readme_messages() if m.startswith("params: ")]
    assert len(documented) >= 30
    for message in documented:
        # "..." in the handbook stands for the rest of a long list; {name} in a case for what
        # depends on the machine or the file (a number, torch's build)
        shown = re.compile(".*".join(re.escape(part) for part in message.split("...")))
        assert any(shown.fullmatch(case) or re.fullmatch(
            re.sub(r"\\\{\w+\\\}", ".+", re.escape(case)), message)
            for case in [c[3] for c in CASES] + [DEVICE_MESSAGE]), message


def test_a_store_a_writer_left_mid_transaction_is_rolled_back_not_refused(tmp_path):
    """kill -9 during a write leaves a hot rollback journal; a read-only connection cannot roll
    it back ("attempt to write a readonly database"), so the check rolls it back as the next
    writer would, and the store passes with the killed transaction undone."""
    import sqlite3

    from lmablate.core.fileio import check_sqlite_store

    path = tmp_path / "optuna.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("create table t (x)")
        db.execute("insert into t values (1)")
        db.commit()
    writer = subprocess.Popen(
        [sys.executable, "-c",
         "import sqlite3, sys, time\n"
         f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
         "db.execute('pragma cache_size = 1')\n"  # spill to the file, so the journal is hot
         "db.execute('begin immediate')\n"
         "db.executemany('insert into t values (?)', ((b'x' * 4000,) for _ in range(500)))\n"
         "print('writing', flush=True)\n"
         "time.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline() == "writing\n"
    writer.kill()
    writer.wait()
    assert (tmp_path / "optuna.db-journal").exists()
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            db.execute("pragma quick_check").fetchall()
    check_sqlite_store(f"sqlite:///{path}", "tune.storage (LMABLATE_OPTUNA_STORAGE)")
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("select x from t").fetchall() == [(1,)]

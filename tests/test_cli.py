"""Bad input through the command line: a one-line error naming the problem, exit status 2,
and no output written. Stage functions on tiny real data: tune -> train -> evaluate."""

import json
import re

import pytest

from lmablate import cli

@pytest.fixture(autouse=True)
def in_project(project, monkeypatch):
    """Every command runs in the tiny project, with the relative paths dvc.yaml would pass."""
    monkeypatch.chdir(project.path)


def tune_args(variant="baseline"):
    return ["tune", "arithmetic", variant, "--tokens", "tokens", "--best", "out/best.json",
            "--trials", "out/trials.csv"]


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_stages_run_on_tiny_data_and_each_ends_with_one_summary_line(project, capsys):
    assert cli.main(tune_args("rope")) == 0
    best = json.loads((project.path / "out" / "best.json").read_text())
    assert best["d_model"] == 16 and 0 < best["lr"] and best["n_trials"] == 3
    assert best["full_budget"] and len(best["bracket"]["points"]) == 1
    # the full-budget rung is a bracket of one learning rate on one seed: its point is the answer
    assert re.fullmatch(
        rf"lmablate tune arithmetic rope: done in \d+\.\d s; 3 trials \(rungs 2 x 0\.5 -> 1 x 1 "
        rf"of the budget; 0 diverged\); lr {best['lr']:.3g} \(best point: 1 finite point\(s\): "
        rf"too few for a curve; 1 full-budget lrs, not bracketed within tune\.bracket_points\), "
        rf"d_model 16, val_answer_loss_mean {best['val_loss']:.4f}; lr not bracketed within "
        rf"tune\.bracket_points", last_line(capsys))
    assert cli.main(["train", "arithmetic", "rope", "--tokens", "tokens", "--best", "out/best.json",
                     "--checkpoints", "out/ck", "--history", "out/history.csv",
                     "--grad-stats", "out/grad.csv"]) == 0
    header = (project.path / "out" / "history.csv").read_text().splitlines()[0]
    assert header == ("budget_flops,seed,step,tokens,train_loss,val_loss,val_answer_loss,"
                      "val_exact_match,lr,elapsed_seconds")  # the answer probe on arithmetic
    assert re.fullmatch(r"lmablate train arithmetic rope: done in \d+\.\d s; 1 seeds x \d+ steps "
                        r"at d_model 16, lr \S+; final val_loss \d\.\d{4} to \d\.\d{4}",
                        last_line(capsys))
    assert cli.main(["evaluate", "arithmetic", "rope", "--tokens", "tokens", "--raw", "raw",
                     "--checkpoints", "out/ck", "--metrics", "out/metrics.json",
                     "--examples", "out/examples.json"]) == 0
    run = json.loads((project.path / "out" / "metrics.json").read_text())["runs"]["seed_0"]
    assert re.fullmatch(
        rf"lmablate evaluate arithmetic rope: done in \d+\.\d s; 1 seeds; test_loss "
        rf"{run['test_loss']:.4f} to {run['test_loss']:.4f}, answer loss "
        rf"{run['answer_loss']:.4f} to {run['answer_loss']:.4f}, exact match "
        rf"{run['exact_match']:.3f} to {run['exact_match']:.3f}", last_line(capsys))
    assert set(run["per_op"]) == {"add", "sub"}  # the default format: integer + and -
    # operand lengths 1-2 from the test split, 3-4 from the length-generalisation split
    splits = {d: r["split"] for d, r in run["by_operand_digits"].items()}
    assert {d for d, s in splits.items() if s == "length"} == {"3", "4"}
    assert "2" in splits and {d for d, s in splits.items() if s == "test"} <= {"1", "2"}
    # rope runs past its context: a loss at every length of evaluate.extrapolation_factors
    assert [x for x, r in run["extrapolation"].items() if isinstance(r, dict)] == [
        "x1", "x2", "x4"]
    assert run["bits_per_char"] == pytest.approx(run["test_loss"] / 0.6931471805599453)
    # a resumed tune with the same settings finds its finished study and runs no new trial
    assert cli.main(tune_args("rope")) == 0


BAD_PARAMS = [
    ("unknown variant", lambda r: r["study"].update(variants=["baseline", "mamba"]), "mamba"),
    ("unknown key", lambda r: r["train"].update(epochs=3), "train.epochs"),
    ("width vs heads", lambda r: r["model"].update(d_model=9), "divisible by n_heads"),
    ("lr <= 0", lambda r: r["train"].update(lr=0.0), "train.lr"),
    ("empty seeds", lambda r: r["study"].update(seeds=[]), "study.seeds"),
    ("bad component", lambda r: r["variants"].update(rope={"position": "spiral"}), "model.position"),
]


@pytest.mark.parametrize("name,change,message", BAD_PARAMS, ids=[b[0] for b in BAD_PARAMS])
def test_bad_params_exit_2_before_work(project, capsys, name, change, message):
    project.write_params(change)
    assert cli.main(tune_args()) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmablate: error:") and message in err
    assert not (project.path / "out").exists()


def test_unknown_variant_on_command_line(project, capsys):
    assert cli.main(tune_args("mamba")) == 2
    assert "variant='mamba'" in capsys.readouterr().err
    assert not (project.path / "out").exists()


def test_split_too_small_for_context(project, capsys):
    project.write_params(lambda r: r["model"].update(context_length=4096))
    assert cli.main(tune_args()) == 2
    err = capsys.readouterr().err
    assert "fewer than context_length + 1" in err and "split" in err
    assert not (project.path / "out").exists()


def test_extrapolation_longer_than_the_test_split_exits_2_before_reading_checkpoints(
        project, capsys):
    project.write_params(lambda r: r["evaluate"].update(extrapolation_factors=[1, 50]))
    assert cli.main(["evaluate", "arithmetic", "rope", "--tokens", "tokens", "--raw", "raw",
                     "--checkpoints", "no/such/dir", "--metrics", "out/m.json",
                     "--examples", "out/e.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lmablate: error: evaluate.extrapolation_factors: [1, 50] needs a "
                          "test split of at least")
    assert not (project.path / "out").exists()


def test_truncated_token_file(project, capsys):
    path = project.path / "tokens" / "train.bin"
    path.write_bytes(path.read_bytes()[:-7])
    assert cli.main(tune_args()) == 2
    assert "train.bin" in capsys.readouterr().err
    assert not (project.path / "out").exists()


def test_checkpoint_vocabulary_mismatch(project, capsys):
    assert cli.main(tune_args()) == 0
    assert cli.main(["train", "arithmetic", "baseline", "--tokens", "tokens", "--best",
                     "out/best.json", "--checkpoints", "out/ck", "--history", "out/h.csv",
                     "--grad-stats", "out/g.csv"]) == 0
    meta = json.loads((project.path / "tokens" / "meta.json").read_text())
    vocab = json.loads((project.path / "tokens" / "vocab.json").read_text())
    vocab["chars"].append("~")
    meta["vocab_size"] += 1
    (project.path / "tokens" / "vocab.json").write_text(json.dumps(vocab))
    (project.path / "tokens" / "meta.json").write_text(json.dumps(meta))
    assert cli.main(["evaluate", "arithmetic", "baseline", "--tokens", "tokens", "--raw", "raw",
                     "--checkpoints", "out/ck", "--metrics", "out/m.json",
                     "--examples", "out/e.json"]) == 2
    assert "vocab_size" in capsys.readouterr().err
    assert not (project.path / "out" / "m.json").exists()


def train_args(best, out, replicate):
    return ["train", "arithmetic", "baseline", "--tokens", "tokens", "--best", best,
            "--checkpoints", f"{out}/ck", "--history", f"{out}/h.csv", "--grad-stats",
            f"{out}/g.csv", "--replicate", str(replicate)]


def test_a_replicate_tunes_trains_and_evaluates_on_seeds_of_its_own(make_project, tmp_path,
                                                                      capsys):
    project = make_project(tmp_path, {"study": {"replicates": 2, "replicate_stages": [1]}})
    assert cli.main(tune_args()) == 0
    assert cli.main(["tune", "arithmetic", "baseline", "--replicate", "1", "--tokens", "tokens",
                     "--best", "r1/best.json", "--trials", "r1/trials.csv"]) == 0
    best, again = (json.loads((project.path / d / "best.json").read_text())
                   for d in ("out", "r1"))
    assert again["sampler_seed"] == best["sampler_seed"] + 1
    assert again["study_name"] != best["study_name"]
    # the study's own values trained as replicate 1 (or the other way round): refused
    for path, replicate in (("out/best.json", 1), ("r1/best.json", 0)):
        assert cli.main(train_args(path, "bad", replicate)) == 2
        err = capsys.readouterr().err
        assert f"replicate {replicate} tunes with" in err and "sampler seed" in err
        assert not (project.path / "bad").exists()
    assert cli.main(train_args("r1/best.json", "r1", 1)) == 0
    assert cli.main(["evaluate", "arithmetic", "baseline", "--replicate", "1", "--tokens",
                     "tokens", "--raw", "raw", "--checkpoints", "r1/ck", "--metrics",
                     "r1/metrics.json", "--examples", "r1/examples.json"]) == 0
    metrics = json.loads((project.path / "r1" / "metrics.json").read_text())
    assert metrics["replicate"] == 1
    # replicate 1's final seed is the study's seed 0 + 100,000, trained with its own tuning
    assert list(metrics["runs"]) == ["seed_100000"]
    assert metrics["runs"]["seed_100000"]["lr"] == again["lr"]


def test_a_replicate_beyond_the_study_is_refused_before_any_work(project, capsys):
    assert cli.main(["tune", "arithmetic", "baseline", "--replicate", "1", "--tokens", "tokens",
                     "--best", "r1/best.json", "--trials", "r1/trials.csv"]) == 2
    assert capsys.readouterr().err.strip() == (
        "lmablate: error: params: --replicate=1 is not allowed; a replicate of the study, "
        "0 .. study.replicates - 1 = 0")
    assert not (project.path / "r1").exists()


def test_a_negative_replicate_is_refused_by_the_parser(project, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["tune", "arithmetic", "baseline", "--replicate", "-1", "--tokens", "tokens",
                  "--best", "out/best.json", "--trials", "out/trials.csv"])
    assert exit_.value.code == 2
    assert "'-1' is not an integer >= 0" in capsys.readouterr().err
    assert not (project.path / "out").exists()

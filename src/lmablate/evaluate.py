"""Stage ``evaluate``: test loss, perplexity, bits per character; arithmetic exact match.

Definitions (seed 000, made deterministic):
- test loss: mean cross-entropy in nats per token over non-overlapping ``context_length`` windows
  of the test split; perplexity = exp(test loss); bits per character = test loss / ln 2 (one
  token is one character).
- arithmetic: every test problem is cut after ``=``; the model decodes greedily, all problems in a
  batch at once with a key/value cache, for as many tokens as the answer has (10 characters + the
  closing ``$``). After the first ``$`` the prediction is padded with ``$`` (seed 000 stops there
  and pads). Character accuracy = share of answer positions equal to the target; exact match =
  share of problems whose every answer position is right. Both overall and per operation.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from . import fileio
from .config import StudyConfig
from .parallel import map_jobs, threads_per_worker, worker_count
from .tokenizer import CharTokenizer, load_tokenizer
from .tracking import NullTracker
from .train import TokenData, autocast, load_checkpoint, resolve_device

OPS = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
OP_INDEX = 12  # "$(" + 10-character operand, then the operator


@torch.no_grad()
def test_loss(model, tokens: np.ndarray, batch_size: int, max_batches: int,
              device: torch.device) -> float:
    """Mean cross-entropy (nats/token) over non-overlapping windows of the test split.

    Raises:
        ValueError: the split is shorter than one window of context_length + 1 tokens.
    """
    T = model.cfg.context_length
    n_windows = min((len(tokens) - 1) // T, batch_size * max_batches)
    if n_windows < 1:
        raise ValueError(f"test split has {len(tokens)} tokens; need at least {T + 1}")
    starts = np.arange(n_windows) * T
    total, count = 0.0, 0
    for chunk in np.array_split(starts, math.ceil(n_windows / batch_size)):
        w = torch.from_numpy(tokens[chunk[:, None] + np.arange(T + 1)].astype(np.int64)).to(device)
        with autocast(device):
            _, loss = model(w[:, :-1], w[:, 1:])
        total += loss.float().item() * len(chunk)
        count += len(chunk)
    return total / count


def split_problem(line: str) -> tuple[str, str]:
    """``$(a op b)=answer$`` -> (prompt up to and including ``=``, answer with its ``$``)."""
    cut = line.index("=") + 1
    return line[:cut], line[cut:]


def arithmetic_predictions(model, tok: CharTokenizer, problems: list[str], batch_size: int,
                           device: torch.device, workers: int = 1) -> list[str]:
    """Greedy, batched, KV-cached completions of each problem's prompt (see module doc).

    Batches of ``batch_size`` problems are decoded ``workers`` at a time in threads (on a CPU;
    each batch is independent, so the predictions do not depend on ``workers``).
    Returns one predicted answer string per problem, as long as its target.

    Raises:
        ValueError: the problems do not share one prompt length and one answer length.
    """
    prompts, targets = zip(*(split_problem(p) for p in problems))
    if len({len(p) for p in prompts}) != 1 or len({len(t) for t in targets}) != 1:
        raise ValueError("arithmetic test problems must share one prompt and answer length")
    n_new = len(targets[0])
    end = tok.token_id("$")

    @torch.inference_mode()
    def decode(start: int) -> list[str]:
        idx = torch.from_numpy(np.stack([tok.encode(p) for p in prompts[start:start + batch_size]])
                               .astype(np.int64)).to(device)
        with autocast(device):
            gen = model.generate(idx, n_new, greedy=True)[:, idx.shape[1]:]  # (B, n_new)
        # Everything after the first "$" becomes "$", as seed 000 pads after stopping.
        stopped = (gen == end).cumsum(dim=1) > 0
        gen = torch.where(stopped, torch.full_like(gen, end), gen)
        return [tok.decode(row) for row in gen.cpu().numpy()]

    starts = range(0, len(prompts), batch_size)
    workers = min(workers, len(starts)) if device.type == "cpu" else 1
    if workers == 1:  # e.g. inside the evaluate stage's seed threads: leave torch's threads be
        batches = [decode(start) for start in starts]
    else:
        batches = map_jobs(decode, starts, workers, max(1, torch.get_num_threads() // workers))
    return [pred for batch in batches for pred in batch]


def arithmetic_scores(problems: list[str], predictions: list[str]) -> dict:
    """Character accuracy and exact match over answer positions, overall and per operation.

    Returns ``{"char_accuracy", "exact_match", "per_op": {"add": {...}, ...}}`` (fractions).
    """
    targets = np.array([list(split_problem(p)[1]) for p in problems])
    preds = np.array([list(p) for p in predictions])
    correct = preds == targets  # (N, answer length)
    ops = np.array([p[OP_INDEX] for p in problems])
    scores = {"char_accuracy": float(correct.mean()), "exact_match": float(correct.all(1).mean())}
    scores["per_op"] = {
        name: {"char_accuracy": float(correct[ops == op].mean()),
               "exact_match": float(correct[ops == op].all(1).mean())}
        for op, name in OPS.items() if (ops == op).any()}
    return scores


@torch.no_grad()
def text_samples(model, tok: CharTokenizer, n: int, length: int, temperature: float,
                 seed: int, device: torch.device) -> list[str]:
    """``n`` samples of ``length`` characters, each started from a newline, seeded."""
    if n == 0:
        return []
    g = torch.Generator(device=device).manual_seed(seed)
    start = tok.encode("\n") if "\n" in tok.chars else np.array([0])
    idx = torch.from_numpy(np.tile(start.astype(np.int64), (n, 1))).to(device)
    out = model.generate(idx, length, temperature=temperature, generator=g)
    return [tok.decode(row) for row in out[:, idx.shape[1]:].cpu().numpy()]


def run(cfg: StudyConfig, dataset: str, variant: str, tokens_dir: Path, raw_dir: Path,
        checkpoints_dir: Path, metrics_path: Path, examples_path: Path,
        tracker: NullTracker) -> dict:
    """Evaluate every seed's checkpoint of ``dataset`` x ``variant``.

    Writes ``metrics_path`` (JSON ``{"dataset", "variant", "runs": {"seed_<s>": {...}}}``, a DVC
    metrics file) and ``examples_path`` (JSON: text samples, or arithmetic predictions with their
    targets, per seed). Test metrics are logged into each seed's MLflow training run, so one run
    per seed carries the same metric names for every variant. Seeds are evaluated concurrently
    on a CPU (see :mod:`lmablate.parallel`).
    """
    ds = cfg.dataset(dataset)
    cfg.check_variant(variant)
    data = TokenData.load(tokens_dir)
    tok = load_tokenizer(tokens_dir)
    device = resolve_device(cfg.train.device)
    problems = []
    if ds.kind == "arithmetic":
        problems = (raw_dir / "test.txt").read_text(encoding="utf-8").split()
        problems = problems[:cfg.evaluate.max_problems]

    def evaluate_seed(seed: int) -> tuple[dict, object]:
        seed_dir = checkpoints_dir / f"seed_{seed}"
        summary = fileio.read_json(seed_dir / "result.json")["summary"]
        model, ckpt = load_checkpoint(seed_dir / "checkpoint.pt", device)
        if ckpt["model_config"]["vocab_size"] != tok.vocab_size:
            raise ValueError(f"{seed_dir / 'checkpoint.pt'}: vocab_size "
                             f"{ckpt['model_config']['vocab_size']} does not match the data's "
                             f"{tok.vocab_size} ({tokens_dir}); retrain")
        loss = test_loss(model, data.test, cfg.evaluate.batch_size, cfg.evaluate.max_batches, device)
        metrics = {**summary, "test_loss": loss, "perplexity": math.exp(loss),
                   "bits_per_char": loss / math.log(2)}
        if ds.kind == "arithmetic":
            preds = arithmetic_predictions(model, tok, problems, cfg.evaluate.batch_size, device)
            metrics.update(arithmetic_scores(problems, preds))
            examples = [{"prompt": split_problem(p)[0], "target": split_problem(p)[1],
                         "prediction": q} for p, q in zip(problems[:10], preds[:10])]
        else:
            examples = text_samples(model, tok, cfg.evaluate.n_samples,
                                    cfg.evaluate.sample_tokens, cfg.evaluate.temperature, seed,
                                    device)
        flat = {k: v for k, v in metrics.items() if isinstance(v, float)}
        for op, s in metrics.get("per_op", {}).items():
            flat.update({f"{k}_{op}": v for k, v in s.items()})
        tags = {"dataset": dataset, "variant": variant, "seed": seed, "stage": "final"}
        with tracker.run(f"{dataset}-{variant}-seed{seed}", tags,
                         run_id=summary.get("mlflow_run_id")):
            tracker.set_tags(tags)
            tracker.log_metrics(flat)
        return metrics, examples

    # Seeds in threads of this process (evaluation draws no global random numbers).
    workers = worker_count(cfg.train, len(cfg.seeds), device, all_at_once=True)
    done = map_jobs(evaluate_seed, cfg.seeds, workers, threads_per_worker(cfg.train, workers))
    runs = {f"seed_{seed}": metrics for seed, (metrics, _) in zip(cfg.seeds, done)}
    examples = {f"seed_{seed}": ex for seed, (_, ex) in zip(cfg.seeds, done)}
    result = {"dataset": dataset, "variant": variant, "runs": runs}
    fileio.write_json(metrics_path, result)
    fileio.write_json(examples_path, examples)
    return result

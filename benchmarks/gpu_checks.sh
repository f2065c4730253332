#!/usr/bin/env bash
# The GPU checks in one call of a GPU machine (its python3 needs torch only; MLflow, Optuna
# and DVC are not needed). From the repository root:
#   bash benchmarks/gpu_checks.sh TOKENS_DIR OUT_DIR [PARTS]
# TOKENS_DIR: data/tokens/shakespeare made with the seed-scale profile (lmablate compose --profile seed-scale) (the whole corpus).
# PARTS: any of the following (default: all), run in this order, each under a time limit so
# that the others still run and report; each part's log goes to OUT_DIR:
#   tests          tests/test_gpu.py
#   study          seed_scale_gpu.py: the seed-scale train stage, 5 variants x 3 seeds
#   bench          bench_batched_seeds.py, seed-scale model, 3 seeds x 500 steps, 1 round
#   bench-default  bench_batched_seeds.py, default model, 5 seeds x 250 steps, 2 rounds
#   compile        bench_batched_seeds.py --compile-only, seed-scale model, 3 seeds x 100 steps
set -uo pipefail
tokens=$1; out=$2; parts=${3:-tests,study,bench,bench-default,compile}
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
has() { [[ ",$parts," == *",$1,"* ]]; }
if has tests; then
  timeout 150 python3 -m pytest -q -s -p no:cacheprovider tests/test_gpu.py 2>&1 | tee "$out/tests.log"
fi
if has study; then
  timeout 330 python3 benchmarks/seed_scale_gpu.py --tokens "$tokens" --out /tmp/seed-scale \
    2>&1 | tee "$out/study.log"
  cp /tmp/seed-scale/results.json "$out/study.json" 2>/dev/null
fi
if has bench; then
  timeout 100 python3 benchmarks/bench_batched_seeds.py --model seed-scale --seeds 3 --steps 500 \
    --rounds 1 --compile-steps 0 2>&1 | tee "$out/bench-seed-scale.log"
fi
if has bench-default; then
  timeout 120 python3 benchmarks/bench_batched_seeds.py --model default --seeds 5 --steps 250 \
    --rounds 2 --compile-steps 0 2>&1 | tee "$out/bench-default.log"
fi
if has compile; then
  timeout 240 python3 benchmarks/bench_batched_seeds.py --model seed-scale --seeds 3 \
    --compile-only --compile-steps 100 --compile-modes ${COMPILE_MODES:-default,reduce-overhead} 2>&1 \
    | tee "$out/compile.log"
fi

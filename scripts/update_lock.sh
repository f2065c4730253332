#!/usr/bin/env bash
# Recompile requirements.lock from pyproject.toml (every extra), with pip-tools:
#   pip install pip-tools && bash scripts/update_lock.sh
# New versions are taken only where pyproject.toml's ranges force them; add --upgrade (or
# --upgrade-package NAME) to move to the newest releases, then run the default study again
# (docs/update_readme.py): other versions can change results.
set -euo pipefail
cd "$(dirname "$0")/.."
pip-compile --quiet --all-extras --strip-extras --no-emit-index-url --no-emit-find-links \
    --no-emit-trusted-host --output-file=requirements.lock "$@" pyproject.toml
# pip takes a local CPU build of torch (2.13.0+cpu) where one is on disk or in an index; the
# lock names the release, which that build and PyPI's wheels both satisfy
sed -i.bak -E 's/^(torch==[0-9.]+)\+[a-z0-9]+$/\1/' requirements.lock && rm requirements.lock.bak

#!/usr/bin/env bash
# Wheels the GPU kit's bundle lacks, added to it after `prepare.sh` (the kit installs every
# wheel in .gpu/wheels): the speculative plugin (prompt lookup is on by default, so the
# servers' comparison runs it), and pytest for the exactness tests on CUDA.
# Usage, from the root of the checkout: bash bench/gpu/extra_wheels.sh [BUNDLE, default .gpu]
set -euo pipefail
DEST="${1:-.gpu}/wheels"
[[ -d "$DEST" ]] || { echo "no $DEST: run the kit's prepare.sh first" >&2; exit 1; }
python3 -m pip wheel -q --no-deps -w "$DEST" ./plugins/speculative
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp -d "$DEST" \
  pytest==9.2.0 pytest-asyncio==1.5.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0
echo "$(ls "$DEST" | wc -l) wheels, bundle $(du -sh "$(dirname "$DEST")" | cut -f1)"

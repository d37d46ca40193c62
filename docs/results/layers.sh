#!/usr/bin/env bash
# The layer contract that CI runs (lint-imports, pyproject.toml [tool.importlinter]): on the code as
# it is, then on a copy of the package where costmodel imports from runners (an upward import).
#   bash docs/results/layers.sh > docs/results/layers.txt
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo '$ lint-imports'
(cd "$repo" && lint-imports --no-cache 2>&1 | sed -n '/^Contracts/,$p'); echo "exit code: $?"
mkdir "$tmp/ncclrl" && cp "$repo/__init__.py" "$tmp/ncclrl/"
for d in costmodel envs agents runners conf plugin; do cp -r "$repo/$d" "$tmp/ncclrl/$d"; done
sed -i '0,/^from ncclrl/s//from ncclrl.runners.config import Command  # an upward import\nfrom ncclrl/' "$tmp/ncclrl/costmodel/simulator.py"
echo; echo '# the same, after adding to costmodel/simulator.py:  from ncclrl.runners.config import Command'
echo '$ lint-imports'
(cd "$tmp" && PYTHONPATH="$tmp" lint-imports --config "$repo/pyproject.toml" --no-cache 2>&1 | sed -n '/^Contracts/,$p'; echo "exit code: ${PIPESTATUS[0]}")

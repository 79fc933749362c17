#!/usr/bin/env bash
# Tests of the Python client against real Palisade processes. From the
# repository root: bash clients/python/test.sh [pytest args…]
# Needs python3 (>= 3.9) and the palisade binary ($PALISADE_BIN, default
# target/debug/palisade); the venv lives outside the repository.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$root"

venv=${PALISADE_PY_VENV:-$HOME/.cache/palisade/venv-python}
export PALISADE_BIN=${PALISADE_BIN:-target/debug/palisade}
# Nothing written into the repository: no bytecode, no caches.
export PYTHONDONTWRITEBYTECODE=1
cache=$(dirname "$venv")

if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  python3 -m venv "$venv"
fi
py=$venv/bin/python

# pip builds a source tree in place (build/, *.egg-info): build from a copy.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp -R "$here/pyproject.toml" "$here/README.md" "$here/src" "$src/"
"$py" -m pip install -q --disable-pip-version-check pytest mypy
"$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$src"

echo "mypy --strict:"
"$py" -m mypy --strict --cache-dir "$cache/mypy-cache" "$here/src"
echo "pytest (PALISADE_BIN=$PALISADE_BIN):"
"$py" -m pytest -q -p no:cacheprovider "$here/tests" "$@"

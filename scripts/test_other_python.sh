#!/usr/bin/env bash
# The whole test suite under another Python, in a virtualenv of its own. CI runs only the machine's python3 (3.11
# today). The project supports 3.10 and newer, and the GPU machines run 3.12. Python 3.12 changed how isinstance
# reads a protocol, which cost fast.yaml its whitening there; only such a run shows a change of that kind
# (docs/gpu-report.md). The first run downloads torch's CUDA build and the dev extras from PyPI (about 6 GB).
# Not part of .ci/run.
# Usage: bash scripts/test_other_python.sh [PYTHON] [VENV_DIR] [-- PYTEST_ARGS]
#   PYTHON: python3.12 by default (with pyenv: PYENV_VERSION=3.12.1 bash scripts/test_other_python.sh)
#   VENV_DIR: .venv-PYTHON in the repository by default (ignored by git)
set -euo pipefail

python=python3.12
venv=""
if [ $# -gt 0 ] && [ "$1" != -- ]; then python=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != -- ]; then venv=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = -- ]; then shift; fi
if [[ "$python" == -* ]]; then
  echo "test_other_python.sh: '$python' is not a Python; give pytest's arguments after --" >&2
  exit 2
fi
if [[ "$python" == */* ]]; then python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python"); fi
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${venv:-$repo/.venv-$(basename "$python")}
mkdir -p "$venv"
venv=$(cd "$venv" && pwd)
cd "$repo"

stamp=$venv/.torch-installed  # written once torch is in: a venv whose first set-up broke is made again
if [ ! -f "$stamp" ]; then
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
  touch "$stamp"
fi
"$venv/bin/pip" install -q -e ".[dev]"
"$venv/bin/python" -c "import sys, torch; print(f'Python {sys.version.split()[0]}, torch {torch.__version__}')"
export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv"
exec "$venv/bin/python" -m pytest -q -n 2 --dist loadfile -p no:cacheprovider "$@"

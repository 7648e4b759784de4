#!/usr/bin/env bash
# The whole test suite under another Python, in a virtualenv of its own. CI runs only the machine's python3 (3.11
# today); users and the GPU machines run 3.12 and newer. Python 3.12 changed how isinstance reads a protocol, which
# cost fast.yaml its whitening there, and only such a run shows a change of that kind (docs/gpu-report.md).
# The first run downloads torch's CUDA build and the dev extras from PyPI (about 6 GB). Not part of .ci/run.
# Usage: bash scripts/test_other_python.sh [PYTHON] [VENV_DIR] [-- PYTEST_ARGS]
#   PYTHON: python3.12 by default (with pyenv: PYENV_VERSION=3.12.1 bash scripts/test_other_python.sh)
#   VENV_DIR: .venv-PYTHON by default (ignored by git)
set -euo pipefail
cd "$(dirname "$0")/.."

python=python3.12
venv=""
if [ $# -gt 0 ] && [ "$1" != -- ]; then python=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != -- ]; then venv=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = -- ]; then shift; fi
venv=${venv:-.venv-$(basename "$python")}

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
fi
"$venv/bin/pip" install -q -e ".[dev]"
"$venv/bin/python" -c "import sys, torch; print(f'Python {sys.version.split()[0]}, torch {torch.__version__}')"
export PATH="$PWD/$venv/bin:$PATH" VIRTUAL_ENV="$PWD/$venv"
exec "$venv/bin/python" -m pytest -q -n 2 --dist loadfile -p no:cacheprovider "$@"

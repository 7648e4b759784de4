#!/usr/bin/env bash
# Before a GPU lease, here (PyPI at hand, the project's venv active): fill .lease/ (ignored by git) with what scripts/gpu_lease.sh needs on
# the device machine, which has torch, torchvision and tensorboard but no network:
#   the wheels of pytorch-ignite, fire, termcolor and airbench (the peer), at this venv's versions;
#   the CIFAR-10 archive and the tool that builds the dataset from it (../shared);
#   a bundle of the history, for the bisect's worktrees (the copy that travels has no .git).
# Then each lease call carries it: run(command="bash scripts/gpu_lease.sh bisect $OUT", carry=[".lease"]).
set -euo pipefail
cd "$(dirname "$0")/.."

shared=${SHARED:-../shared}
version() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
rm -rf .lease
mkdir -p .lease
cp "$shared/data/cifar10-jpg.tar.xz" "$shared/tools/make_cifar10.py" .lease/
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py --abi none \
  --platform any -d .lease "pytorch-ignite==$(version pytorch-ignite)" "fire==$(version fire)" \
  "termcolor==$(version termcolor)"
python3 -m pip wheel -q --no-deps -w .lease "airbench==$(version airbench)"  # (an sdist only: built here)
git bundle create -q .lease/history.bundle --all
ls .lease
du -sh .lease

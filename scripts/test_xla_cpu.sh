#!/usr/bin/env bash
# XLA smoke test on this CPU: torch-xla's PJRT CPU device stands in for a TPU core.
# Builds its own virtualenv (torch 2.9.0 + torch-xla 2.9.0, the newest pair on PyPI; about 4 GB to download
# once), then trains a few iterations through cifar10_dist.train() with backend xla-tpu, in-process and via
# Ignite's spawn (1 device). Not part of .ci/run: the download alone can exceed CI's budget.
# Usage: bash scripts/test_xla_cpu.sh [VENV_DIR]   (default: .xla-venv next to the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-.xla-venv}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.9.0 torchvision==0.24.0 torch-xla==2.9.0
fi
"$venv/bin/pip" install -q -e .

export PJRT_DEVICE=CPU CPU_NUM_DEVICES=1
"$venv/bin/python" - <<'PY'
import tempfile
import time
from pathlib import Path

import torch
import torch_xla

from cifar10_dist import evaluate, train

print(f"torch {torch.__version__}, torch-xla {torch_xla.__version__}")
common = dict(dataset="synthetic", synthetic_size=640, model="simple_cnn", batch_size=64, num_workers=0,
              num_epochs=2, num_warmup_epochs=0.5, learning_rate=0.1, train_eval_size=128, log_every_iters=5,
              with_amp=True)
for launch in ({"backend": "xla-tpu"}, {"backend": "xla-tpu", "nproc_per_node": 1}):
    with tempfile.TemporaryDirectory() as output:
        start = time.perf_counter()
        result = train(output_path=output, run_name="xla", checkpoint_every=5, **common, **launch)
        seconds = time.perf_counter() - start
        accuracy = result.test.accuracy
        print(f"{launch}: test accuracy {accuracy:.3f} after {result.iterations} iterations, {seconds:.1f} s")
        assert accuracy > 0.3, f"{launch}: the model did not learn (accuracy {accuracy})"
        # the optimizer wrapper must keep its momentum where checkpoints see it (xla_compat patch 3)
        checkpoint = torch.load(Path(output, "xla", "training_checkpoint_20.pt"), weights_only=True)
        assert checkpoint["optimizer"]["state"], "training checkpoint without optimizer state"
        # resume from iteration 15 and finish: the same final weights as the uninterrupted run
        resumed = train(output_path=output, run_name="xla", resume_from=str(Path(output, "xla",
                        "training_checkpoint_15.pt")), checkpoint_every=5, **common, **launch)
        final = torch.load(Path(output, "xla", "training_checkpoint_20.pt"), weights_only=True)
        same = all(torch.equal(final["model"][k], checkpoint["model"][k]) for k in final["model"])
        print(f"{launch}: resumed from iteration 15 -> accuracy {resumed.test.accuracy:.3f}, "
              f"final weights identical to the uninterrupted run: {same}")
        assert same and resumed.test.accuracy == accuracy
        evaluated = evaluate(Path(output, "xla", "training_checkpoint_20.pt"), backend=launch["backend"])
        print(f"{launch}: evaluate() -> accuracy {evaluated.accuracy:.3f}")
        assert evaluated.accuracy == accuracy
print("XLA smoke test passed")
PY

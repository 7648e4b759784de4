"""Gradient accumulation against the larger batch: max abs / relative weight difference after 10 optimizer steps.

    python scripts/accumulation_equivalence.py

A model without BatchNorm, 640 synthetic images, no augmentation, a constant learning rate: batch 128 against
64 x 2 and 32 x 4 accumulated batches, in one process and in 2 spawned gloo processes (about a minute on 2 cores).
"""
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

tmp = Path(tempfile.mkdtemp())
(tmp / "nobn.py").write_text(textwrap.dedent("""\
    from torch import nn
    def net():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),
                             nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                             nn.Linear(16, 10))
    """))
common = ["--dataset=synthetic", "--synthetic_size=640", "--train_eval_size=0", "--num_workers=0", "--crop_padding=0",
          "--flip=none", "--num_epochs=2", "--num_warmup_epochs=0", "--lr_end=1.0", "--learning_rate=0.05",
          "--validate_every=2", "--checkpoint_every=10", f"--model={tmp / 'nobn.py'}:net", f"--output_path={tmp}"]
for ws, launch in ((1, []), (2, ["--backend=gloo", "--nproc_per_node=2"])):
    for name, extra in (("large", ["--batch_size=128"]), ("acc", ["--batch_size=64", "--accumulation_steps=2"]),
                        ("acc4", ["--batch_size=32", "--accumulation_steps=4", "--checkpoint_every=20"])):
        subprocess.run([sys.executable, "-m", "cifar10_dist", "run", *common, *launch, *extra, f"--run_name={name}{ws}"],
                       check=True, capture_output=True)
    large = torch.load(tmp / f"large{ws}" / "training_checkpoint_10.pt", weights_only=True)["model"]
    for name, it in (("acc", 20), ("acc4", 40)):
        other = torch.load(tmp / f"{name}{ws}" / f"training_checkpoint_{it}.pt", weights_only=True)["model"]
        diff = max((large[k] - other[k]).abs().max().item() for k in large)
        rel = max(((large[k] - other[k]).abs().max() / large[k].abs().max()).item() for k in large)
        print(f"world size {ws}: batch 128 vs {name}: 10 optimizer steps, max abs diff {diff:.2e}, max rel {rel:.2e}")
shutil.rmtree(tmp)

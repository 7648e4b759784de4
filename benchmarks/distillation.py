"""Distillation measured: a small student trained with and without a teacher at the same budget on CIFAR-10.

The teacher is configs/fast.yaml's airbench (10 epochs; its best-model file); the student simple_cnn, trained
--epochs epochs with the recipe below, once alone and once with --teacher (distill_alpha 0.5, temperature 4),
same seed, same everything else. One seed each.

    python -m benchmarks.distillation --cifar=DIR [--epochs=10] [--json=PATH]

Docs: docs/ship-it.md.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import records, runner

STUDENT = {
    "model": "simple_cnn",
    "batch_size": 512,
    "learning_rate": 0.2,
    "num_warmup_epochs": 1,
    "weight_decay": 5e-4,
    "validate_every": 100,
    "tta": 0,
}


def row(name: str, finished: runner.OurRun) -> dict[str, Any]:
    test = finished.summary.final["test"]
    print(
        f"{name}: test accuracy {test.accuracy:.4f}, NLL {test.loss:.4f}, ECE {test.ece:.4f} "
        f"({finished.summary.training_time:.0f} s of training)",
        flush=True,
    )
    return {
        "accuracy": test.accuracy,
        "nll": test.loss,
        "ece": test.ece,
        "test_images": test.num_samples,
        "training_seconds": finished.summary.training_time,
        "epochs": finished.summary.epochs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cifar", required=True, help="folder holding cifar-10-batches-py")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--json", dest="json_path", default="docs/measurements/distillation_cpu.json")
    parser.add_argument("--keep_teacher", help="copy the teacher's best-model file here (e.g. for benchmarks.int8)")
    parser.add_argument(
        "--teacher_label_smoothing",
        type=float,
        default=None,
        help="train the teacher with this label smoothing instead of fast.yaml's 0.2",
    )
    parser.add_argument("--skip_alone", action="store_true", help="leave out the student alone (run before)")
    args = parser.parse_args()
    machine = records.machine("cpu")
    print(f"{machine}, torch {torch.__version__}", flush=True)
    student = {**STUDENT, "num_epochs": args.epochs, "data_path": args.cifar}
    with tempfile.TemporaryDirectory(prefix="benchmark-distillation-") as temporary:
        output = Path(temporary)
        smoothing = {} if args.teacher_label_smoothing is None else {"label_smoothing": args.teacher_label_smoothing}
        teacher_run = runner.train_ours(
            output, records.REPO / "configs" / "fast.yaml", "cpu", run_name="teacher", data_path=args.cifar, **smoothing
        )
        teacher = sorted(teacher_run.run_dir.glob("best_model_*.pt"))[-1]
        if args.keep_teacher:
            shutil.copyfile(teacher, args.keep_teacher)
        runs = {"teacher (fast.yaml, airbench)": row("teacher", teacher_run)}
        if not args.skip_alone:
            runs["student alone"] = row(
                "student alone", runner.train_ours(output, None, "cpu", run_name="alone", **student)
            )
        runs["student with the teacher"] = row(
            "student with the teacher",
            runner.train_ours(output, None, "cpu", run_name="taught", teacher=str(teacher), **student),
        )
    records.write(
        Path(args.json_path),
        {
            "machine": machine,
            "hardware": records.hardware_record(),
            "torch": str(torch.__version__),
            "student": student,
            "teacher_label_smoothing": args.teacher_label_smoothing,
            "distill_alpha": 0.5,
            "distill_temperature": 4.0,
            "runs": runs,
        },
    )
    print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()

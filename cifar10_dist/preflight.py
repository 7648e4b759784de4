"""Checks of a resolved config against the world, made once, before any process starts: the model registry,
the files the config names, and the launch environment (torchrun, GPUs, optional backends); a script's main
guard is checked sooner, by ``start_method``.

``config`` checks the values alone (and imports no torch); everything that has to look around is here.
Each check raises a UserError naming the value and what to do instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import ignite.distributed as idist
import torch

from cifar10_dist import checkpoint_layout, models
from cifar10_dist.config import Config, class_weights, located_in_its_file, note, planned_world_size
from cifar10_dist.data import datasets, resizing
from cifar10_dist.errors import UserError
from cifar10_dist.launch.start_method import launch_rank, started_by_torchrun
from cifar10_dist.models import pretrained
from cifar10_dist.outputs import checkpoint_files, trackers
from cifar10_dist.system import cpu, stopping
from cifar10_dist.training.setup import optimizers


def check_before_launch(config: Config) -> None:
    """Everything that would crash or hang later, refused now with a message saying what to do instead; an error
    about a value of the config file names its file and line."""
    try:
        _check(config)
    except UserError as error:
        raise located_in_its_file(error, config) from error


def _check(config: Config) -> None:
    source = datasets.implementation(config.dataset)
    source.preflight(config)  # e.g. a folder's layout (one line); its images are read by the run
    info = source.info(config)
    classes = info.classes
    models.check_model(config.model, config.model_kwargs, len(classes), config.image_size)
    check_resizing(config, len(classes), info.image_size)
    parsed_weights = class_weights(config.class_weights)
    if parsed_weights is not None:
        parsed_weights.check(classes)
    if config.pretrained is not None:  # the weights named now; fetched once, before any worker starts
        weights = pretrained.resolve(config.model, config.pretrained)
        if config.resume_from is None:
            pretrained.fetch(weights)
    check_teacher(config)
    check_files(config)
    check_launch(config)
    check_batch_fits_world(config)
    stopping.preemption_signals()  # a bad CIFAR10_DIST_PREEMPTION_SIGNALS: one line now, not in every worker
    check_amp_dtype(config)
    optimizers.check_muon_available(config.muon_lr)
    trackers.check_installed(config)


def check_resizing(config: Config, classes: int, full: int) -> None:
    """Progressive resizing's smallest images go through the model once now: a model that cannot take them (a
    fixed-size head, pooling that runs out of pixels) is refused before training, naming the size."""
    sizes = resizing.schedule(config.resize_start, config.resize_until, config.num_epochs, full)
    if not sizes.active or sizes.smallest == full:
        return
    try:
        models.check_model(config.model, config.model_kwargs, classes, sizes.smallest)
    except UserError as error:
        raise UserError(
            f"resize_start={config.resize_start:g}: model='{config.model}' cannot take the first epoch's "
            f"{sizes.smallest}x{sizes.smallest} images ({str(error).split(': ', 1)[-1]}); raise "
            "resize_start, or leave it at 1 (off)"
        ) from error


def check_teacher(config: Config) -> None:
    """A teacher file that exists, or a teacher's weights named and fetched once, before any worker starts."""
    if config.teacher is None:
        return
    if config.teacher_pretrained is None:
        if not Path(config.teacher).expanduser().is_file():
            raise UserError(
                f"teacher='{config.teacher}' does not exist: give one of our checkpoints or best-model "
                "files, or a model name with --teacher_pretrained"
            )
        return
    weights = pretrained.resolve(config.teacher, config.teacher_pretrained)
    pretrained.fetch(weights)


def check_resume_file(path: str) -> None:
    """``resume_from``: a training checkpoint, refused in one line before anything is written otherwise (a
    best-model file holds one epoch's weights only: the advice says how to start from them)."""
    if not Path(path).is_file():
        raise UserError(f"resume_from='{path}' does not exist: give a training_checkpoint_*.pt file (or auto)")
    checkpoint = checkpoint_files.load_checkpoint(path, mmap=True)
    missing = checkpoint_layout.missing_training_keys(checkpoint)
    if not missing:
        return
    if checkpoint_layout.MODEL in checkpoint and checkpoint_layout.TRAINER not in checkpoint:
        raise UserError(
            f"resume_from='{path}' is a best-model file (one epoch's weights, no optimizer or trainer "
            f"state), and a run continues from a training checkpoint: --resume_from takes a "
            f"training_checkpoint_*.pt file or auto; to start a new run from these weights, give "
            f"--pretrained={path}"
        )
    raise UserError(
        f"resume_from='{path}' is not a training checkpoint (missing {', '.join(missing)}): give a "
        "training_checkpoint_*.pt file (or auto)"
    )


def check_amp_dtype(config: Config) -> None:
    if (
        config.with_amp
        and config.amp_dtype == "bfloat16"
        and torch.cuda.is_available()
        and not torch.cuda.is_bf16_supported()
    ):
        raise UserError(
            f"amp_dtype=bfloat16: {torch.cuda.get_device_name()} has no bf16; use amp_dtype=float16 (or auto)"
        )


def check_files(config: Config) -> None:
    if config.resume_from not in (None, "auto"):
        check_resume_file(config.resume_from)
    if not config.init_method.startswith("file://"):
        return
    init_file = Path(config.init_method.removeprefix("file://"))
    if not init_file.parent.is_dir():
        raise UserError(f"init_method='{config.init_method}': the folder {init_file.parent} does not exist")
    single_node_spawn = config.nproc_per_node is not None and (config.nnodes or 1) == 1
    if single_node_spawn and init_file.exists():
        raise UserError(
            f"init_method='{config.init_method}': the file already exists (left by an earlier run?); "
            "torch needs a new, empty file for every run: delete it or choose another name"
        )


def check_launch(config: Config) -> None:
    if started_by_torchrun():
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if config.nproc_per_node is not None:
            raise UserError(
                f"nproc_per_node={config.nproc_per_node} cannot be used under torchrun, which already started "
                f"{world_size} processes: drop --nproc_per_node (torchrun's own --nproc_per_node sets it)"
            )
        if config.backend is None and world_size > 1:
            raise UserError(
                f"torchrun started {world_size} processes but backend is None: add --backend=gloo (CPU) or nccl (GPU)"
            )
    if config.backend is not None and config.nproc_per_node is not None and torch.cuda.is_available():
        if config.nproc_per_node > torch.cuda.device_count():
            raise UserError(
                f"nproc_per_node={config.nproc_per_node} is more than the {torch.cuda.device_count()} visible GPUs: "
                "to run several replicas per GPU, start them with srun or torchrun and --backend=gloo "
                "(see scripts/slurm/shared_gpu.sbatch)"
            )
    if config.backend == "nccl" and not torch.cuda.is_available():
        raise UserError("backend='nccl' needs CUDA GPUs, but none is available here: use --backend=gloo on CPU")
    if config.backend == "xla-tpu" and not idist.has_xla_support:
        raise UserError("backend='xla-tpu' needs torch_xla, which is not installed (TPU runtimes provide it)")
    if config.backend == "horovod" and not idist.has_hvd_support:
        raise UserError("backend='horovod' needs horovod, which is not installed: pip install horovod")
    say_when_more_processes_will_not_help(config)


def say_when_more_processes_will_not_help(config: Config) -> None:
    """One line, from the launcher (or torchrun's first process), when several processes of one machine share its
    CPU cores (``cpu.several_processes_here``)."""
    local = config.nproc_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if config.backend is None or torch.cuda.is_available() or launch_rank(config.node_rank) != 0:
        return
    cores = cpu.usable_cores()
    threads = int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS", "").isdigit() else 0
    line = cpu.several_processes_here(local, threads or max(1, cores // local), cores)
    if line is not None:
        note(line)


def expected_world_size(config: Config) -> int | None:
    """The world size this launch will have: from the config (spawning or one process), torchrun's WORLD_SIZE,
    or srun's SLURM_NTASKS; None where nothing says yet."""
    planned = planned_world_size(config)
    if planned is not None:
        return planned
    for variable in ("WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return None


def check_batch_fits_world(config: Config) -> None:
    world_size = expected_world_size(config)
    if world_size is not None and config.batch_size < world_size:
        raise UserError(
            f"batch_size={config.batch_size} is smaller than the world size {world_size}: every process needs a sample"
        )

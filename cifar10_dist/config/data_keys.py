"""The data a run reads and how it is fed: the dataset, its folder and cache, workers, the held-out split,
data_on_device and the sampler. Fields of ``Config`` (``config.fields`` composes them; one flat set of keys for
flags, YAML and the API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

from cifar10_dist.config.options import AT_LEAST_0, Bounds, option


@dataclass(frozen=True)
class DataKeys:
    """The data a run reads and how it is fed."""

    dataset: str = option(
        "cifar10",
        "cifar10 or cifar100 (files in data_path), synthetic (generated in memory), or "
        "folder (data_path/train/<class>/<images>, optionally test/ and val/: docs/your-data.md)",
        short="cifar10, cifar100, synthetic or folder",
        tunable=False,
        inherited_by_evaluate=True,
    )
    data_path: str = option(
        "cifar10",
        "folder holding cifar-10-batches-py or cifar-100-python (downloaded there when missing)",
        short="where the dataset's files are",
        per_tuning_worker=True,
        inherited_by_evaluate=True,
    )
    label_mode: Literal["fine", "coarse"] = option(
        "fine",
        "CIFAR-100 labels: fine (100 classes) or coarse (20 superclasses)",
        short="CIFAR-100 labels: fine or coarse",
        choices_in_words="fine or coarse",
        inherited_by_evaluate=True,
    )
    download: bool = option(
        True,
        "download CIFAR-10 into data_path when it is missing (False: fail at once)",
        short="download CIFAR-10 when it is missing",
        per_tuning_worker=True,
    )
    image_size: int = option(
        32,
        "dataset=folder: images are stored and trained at this size (shorter side scaled, centre crop); CIFAR is 32",
        short="folder: the size images train at",
        bounds=Bounds(8, 1024, in_words="in 8..1024 pixels"),
        inherited_by_evaluate=True,
    )
    skip_bad_images: bool = option(
        False,
        "dataset=folder: train without unreadable image files (else refused, naming them)",
        short="folder: train without unreadable images",
        tunable=False,
        inherited_by_evaluate=True,
    )
    drop_test_duplicates: bool = option(
        False,
        "dataset=folder: remove test/val images that are exact copies of "
        "training images (always counted and warned about)",
        short="folder: drop test copies of train images",
        tunable=False,
        inherited_by_evaluate=True,
    )
    cache_dir: Optional[str] = option(
        None,
        "dataset=folder: where the decoded images are cached (default: "
        "data_path/.cifar10_dist_cache); a node-local folder (e.g. $SLURM_TMPDIR) "
        "gets a copy of the cache beside the data when there is one, once per node",
        short="folder: where the decoded images are cached",
        per_tuning_worker=True,
        inherited_by_evaluate=True,
    )
    synthetic_size: int = option(
        5000,
        "training images when dataset=synthetic (test set: a fifth of it)",
        short="training images of synthetic data",
        bounds=Bounds(10, in_words="at least 10 (it is too small)"),
        tunable=False,
        inherited_by_evaluate=True,
    )
    num_workers: Union[int, str] = option(
        "auto",
        "DataLoader worker processes per node (split over local processes); "
        "auto: 0 on a CPU from images that fit in memory, 2 from disk; on an "
        "accelerator each process's cores but one, 2 to 8",
        short="DataLoader worker processes per node",
        also_accepts=("auto",),
        bounds=AT_LEAST_0,
        per_tuning_worker=True,
    )
    train_eval_size: int = option(
        5000,
        "size of the fixed, non-augmented train subset used for train metrics",
        short="train images evaluated for train metrics",
        bounds=Bounds(0, in_words="0 (off) or more"),
        may_change_on_resume=True,  # (evaluation only: training goes on the same)
    )
    val_split: float = option(
        0.0,
        "fraction of training images held out for validation and best-model choice; "
        "test set then used once at the end (0: validate on the test set)",
        short="fraction of train images held out for val",
        bounds=Bounds(0, 1, high_open=True, note=", e.g. 0.1"),
        tunable=False,
    )
    val_seed: int = option(
        0,
        "seed of the held-out choice (independent of seed and world size)",
        short="seed of the held-out choice",
        tunable=False,
    )
    data_on_device: Union[bool, str] = option(
        "auto",
        "all images kept on the training device, batches sliced there; "
        "auto: on a CUDA GPU if under 25% of its free memory",
        short="keep all images on the training device",
        also_accepts=("auto",),
        may_change_on_resume=True,
    )
    sampler: Literal["shuffle", "balanced"] = option(
        "shuffle",
        "training order: shuffle (each image once per epoch) or balanced (each epoch draws as many images, "
        "every class equally likely, with replacement: for imbalanced classes)",
        short="training order: shuffle or balanced",
    )
    class_weights: Optional[str] = option(
        None,
        "weight each class in the training loss: auto (inverse class "
        "frequency of the training split) or one weight per class, e.g. 1,1,5",
        short="per-class loss weights: auto or 1,1,5",
    )

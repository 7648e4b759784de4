"""The dataset sources by name (``dataset=NAME``): what each accepts in the config and which module of
``cifar10_dist.data`` implements it. The rest of the code asks this registry; none of it compares dataset names.

Light on purpose (the config is checked before torch is imported): a source names its module, which is imported
when the source is used (``data.records.implementation``), as timm's reader factory defers each reader's imports.
The module is a ``data.records.DataSource`` (mypy checks each registered one), each function taking the resolved
``Config``:

- ``info(config)`` -> ``data.records.DatasetInfo``: the classes (and the default normalisation and size), before
  any image is read (a model is built from it);
- ``load(config)`` -> ``data.records.LoadedData``: the run's images, downloaded or cached first where that is
  needed (by one process per node while the others wait: ``idist.one_rank_first(local=True)``);
- ``preflight(config)``: checks against the filesystem before any process starts (one line for a bad layout);
- ``sample_images(config, limit)`` -> (uint8 images (N, 3, S, S), what they are), or None: up to ``limit``
  images of the data a checkpoint's recorded config names, for ``export``'s check;
- ``prepare(config, synthetic, synthetic_test, seed)`` -> ``results.PreparedData``: the ``prepare-data``
  command.

Adding a source is a module with those five functions plus one ``register`` line below (docs/your-data.md has
an example).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType

from cifar10_dist.errors import UserError

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
NUM_CLASSES = len(CIFAR10_CLASSES)  # a model's classes when nothing says otherwise (CIFAR-10's)


@dataclass(frozen=True)
class Source:
    """A dataset source: its name, its module, and the config values it accepts beyond the defaults."""

    name: str
    module: str  # dotted name of the module that implements it
    label_modes: dict[str, str] = field(default_factory=lambda: {"fine": "its classes"})  # label_mode: what it means
    image_size: int | None = 32  # its images' size; None: any (the image_size key chooses)
    own_val: bool = False  # its data may bring a validation split of its own (a folder's val/)

    def implementation(self) -> ModuleType:
        return importlib.import_module(self.module)


SOURCES: dict[str, Source] = {}


def register(source: Source) -> Source:
    """Make ``dataset=source.name`` a valid config value, implemented by ``source.module``."""
    SOURCES[source.name] = source
    return source


def source_of(name: str) -> Source:
    """The registered source of that name, or one line listing the ones there are."""
    if name not in SOURCES:
        raise UserError(f"dataset='{name}' is unknown: choose one of {', '.join(SOURCES)}")
    return SOURCES[name]


def check(name: str, label_mode: str, image_size: int) -> None:
    """The config keys a source decides: its name, the label modes it has, whether image_size may change."""
    source = source_of(name)
    if label_mode not in source.label_modes:
        owner = next((other for other in SOURCES.values() if label_mode in other.label_modes), None)
        meaning = f" ({owner.label_modes[label_mode]})" if owner else ""
        raise UserError(
            f"label_mode='{label_mode}' is for dataset={owner.name if owner else '?'}{meaning}, not dataset={name}"
        )
    if source.image_size is not None and image_size != source.image_size:
        free = ", ".join(other.name for other in SOURCES.values() if other.image_size is None)
        raise UserError(
            f"image_size={image_size} is for dataset={free}: {name} images are {source.image_size}x{source.image_size}"
        )


register(Source("cifar10", "cifar10_dist.data.cifar"))
register(
    Source(
        "cifar100", "cifar10_dist.data.cifar", label_modes={"fine": "its 100 classes", "coarse": "its 20 superclasses"}
    )
)
register(Source("synthetic", "cifar10_dist.data.synthetic"))
register(Source("folder", "cifar10_dist.data.folder_source", image_size=None, own_val=True))

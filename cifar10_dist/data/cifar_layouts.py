"""CIFAR-10's and CIFAR-100's standard on-disk layouts (torchvision's): folders, batch files, release archives
and their md5 sums, and the class names (CIFAR-100's fine classes and superclasses)."""

from __future__ import annotations

from dataclasses import dataclass

from cifar10_dist.data.datasets import CLASSES, DatasetInfo

FOLDER = "cifar-10-batches-py"
ARCHIVE = "cifar-10-python.tar.gz"
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
# md5 sums of the official release (as listed by torchvision.datasets.CIFAR10)
OFFICIAL_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
}
CIFAR100_FOLDER = "cifar-100-python"
CIFAR100_ARCHIVE = "cifar-100-python.tar.gz"
CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
CIFAR100_MD5 = {
    "train": "16019d7e3df5f24257cddd939b257f8d",
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",
    "meta": "7973b15100ade9c7d40fb424638fde48",
}
CIFAR100_FINE = (
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm"
).split()
CIFAR100_COARSE = (
    "aquatic_mammals fish flowers food_containers fruit_and_vegetables household_electrical_devices "
    "household_furniture insects large_carnivores large_man-made_outdoor_things large_natural_outdoor_scenes "
    "large_omnivores_and_herbivores medium_mammals non-insect_invertebrates people reptiles small_mammals trees "
    "vehicles_1 vehicles_2"
).split()


@dataclass(frozen=True)
class Layout:
    """A dataset's standard on-disk layout (torchvision's): folder, pickled batch files, release archive."""

    name: str
    folder: str
    train_files: tuple[str, ...]
    test_file: str
    archive: str
    url: str
    official_md5: dict[str, str]
    classes: dict[str, tuple[str, ...]]  # label_mode -> class names
    label_key: str = "labels"  # the batch files' labels, {mode} replaced by label_mode


LAYOUTS = {
    "cifar10": Layout("CIFAR-10", FOLDER, TRAIN_FILES, TEST_FILE, ARCHIVE, URL, OFFICIAL_MD5, {"fine": CLASSES}),
    "cifar100": Layout(
        "CIFAR-100",
        CIFAR100_FOLDER,
        ("train",),
        "test",
        CIFAR100_ARCHIVE,
        CIFAR100_URL,
        CIFAR100_MD5,
        {"fine": tuple(CIFAR100_FINE), "coarse": tuple(CIFAR100_COARSE)},
        "{mode}_labels",
    ),
}


def class_names(dataset: str, label_mode: str = "fine") -> tuple[str, ...]:
    """The class names of a dataset (CIFAR-100: 100 fine classes, or 20 superclasses with label_mode=coarse);
    CIFAR-10's for synthetic data (and for checkpoints that record no classes)."""
    return LAYOUTS.get(dataset, LAYOUTS["cifar10"]).classes[label_mode]


def num_classes(dataset: str, label_mode: str = "fine") -> int:
    return len(class_names(dataset, label_mode))


def cifar_info(dataset: str, label_mode: str = "fine") -> DatasetInfo:
    """CIFAR-10/100 and synthetic data: their class names and CIFAR-10's channel statistics, 32x32."""
    return DatasetInfo(class_names(dataset, label_mode))

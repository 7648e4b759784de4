"""What produced a run: package version and git commit, library versions, backend, devices, dataset checksum, and
the choices made on the way (memory format, class weights, pretrained start, teacher, a resume on changed data).

One typed record (``Provenance``): a field per fact, written by the module that owns the fact (a misspelt field is
an AttributeError: the record has slots), serialised by ``to_dict`` to provenance.json and under a checkpoint's
``meta``, and read back by ``from_dict`` (older files: what they hold of it). ``evaluate`` compares a checkpoint's
record with the present package and data and warns when they differ.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import re
import subprocess
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

import ignite
import ignite.distributed as idist
import torch

from cifar10_dist import checkpoint_layout
from cifar10_dist.system import hardware

PACKAGE = "cifar10-dist"


@dataclass(slots=True)
class DataRecord:
    """The data a run trained on."""

    name: str  # the dataset source (cifar10, folder, ...)
    sha256: str | None  # dataset_sha256 of its train and test images and labels (None off rank 0 before gathering)
    info: dict[str, Any] | None = None  # classes, normalisation, sizes (DatasetInfo.to_dict)
    images: dict[str, int] | None = None  # images per split
    checks: dict[str, Any] | None = None  # a folder's check findings (duplicates, unreadable files, ...)

    def to_dict(self) -> dict[str, Any]:
        return _set_items(self)

    @property
    def classes(self) -> list[str] | None:
        """The class names trained on, in label order (None where not recorded)."""
        found = (self.info or {}).get("classes")
        return list(found) if found is not None else None


@dataclass(slots=True)
class DataChange:
    """A resume on other data (``resume_on_changed_data``): the checkpoint continued from, and the data's checksum
    and images per split as it records them (then) and as this run has them (now)."""

    checkpoint: str
    sha256_then: str
    sha256_now: str
    images_then: dict[str, int] | None
    images_now: dict[str, int] | None

    def to_dict(self) -> dict[str, Any]:
        return {one.name: getattr(self, one.name) for one in fields(self)}

    @classmethod
    def from_dict(cls, recorded: Mapping[str, Any] | None) -> DataChange | None:
        if not recorded:
            return None
        return cls(
            str(recorded["checkpoint"]),
            str(recorded["sha256_then"]),
            str(recorded["sha256_now"]),
            recorded.get("images_then"),
            recorded.get("images_now"),
        )


@dataclass(slots=True)
class PackageBuild:
    """The package that ran: its name and version, whether that is a release (False: a development build; None in
    files from before it was recorded), and its checkout's git commit and whether tracked files differed from it
    (None where it ran from an installed copy)."""

    name: str = PACKAGE
    version: str | None = None
    release: bool | None = None
    git_commit: str | None = None
    git_dirty: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """As provenance.json holds it (``release`` only where it was recorded)."""
        return {
            one.name: getattr(self, one.name)
            for one in fields(self)
            if one.name != "release" or self.release is not None
        }

    @classmethod
    def from_dict(cls, recorded: Mapping[str, Any] | None) -> PackageBuild:
        names = {one.name for one in fields(cls)}
        return cls(**{key: value for key, value in (recorded or {}).items() if key in names})


@dataclass(slots=True)
class Provenance:
    """provenance.json: what produced a run, one field per fact."""

    package: PackageBuild
    versions: dict[str, str]  # python, torch, torchvision, pytorch-ignite
    backend: str | None  # the distributed backend (None: one process)
    world_size: int
    devices: dict[str, int]  # processes per kind of device
    precision: str  # what training computes in: fp32, bf16, fp16
    hardware: dict[str, Any]  # this process's CPU and GPUs (system.hardware.describe)
    dataset: DataRecord
    memory_format: str | None = None  # channels_last=auto's choice and why (training.setup.layouts)
    class_weights: list[float] | None = None  # class_weights=auto's weights (training.setup.loss)
    pretrained: dict[str, Any] | None = None  # the pretrained start: kind, name, url or path, sha256
    teacher: dict[str, Any] | None = None  # distillation's teacher (training.trained_models.distillation)
    resumed_on_changed_data: DataChange | None = None  # resume_on_changed_data: what changed
    config_file: dict[str, Any] | None = None  # the config file read: path, shipped (config.ConfigSource)
    resumed_from: str | None = None  # the training checkpoint the run continued from
    grad_compression: str | None = None  # the gradients exchanged compressed with (training.setup.compression)
    shuffle: str | None = None  # how each epoch's order is drawn (data.loaders.order_seed; older files: seed+epoch)
    extra: dict[str, Any] = field(default_factory=dict)  # an older file's keys that are no fields now

    def to_dict(self) -> dict[str, Any]:
        """provenance.json's content: every fact that is set, the dataset as its own object."""
        found = {key: value for key, value in _set_items(self).items() if key != "extra"}
        if self.resumed_on_changed_data is not None:
            found["resumed_on_changed_data"] = self.resumed_on_changed_data.to_dict()
        return {**self.extra, **found, "package": self.package.to_dict(), "dataset": self.dataset.to_dict()}

    @classmethod
    def from_dict(cls, recorded: Mapping[str, Any]) -> Provenance:
        """A record read back (provenance.json, a checkpoint's meta); keys it no longer has go to ``extra``."""
        names = {one.name for one in fields(cls)} - {"extra", "dataset", "package"}
        data_names = {one.name for one in fields(DataRecord)}
        dataset = dict(recorded.get("dataset") or {})
        present: dict[str, Any] = {key: recorded.get(key) for key in names}
        present["resumed_on_changed_data"] = DataChange.from_dict(recorded.get("resumed_on_changed_data"))
        return cls(
            **present,
            package=PackageBuild.from_dict(recorded.get("package")),
            dataset=DataRecord(
                **{
                    key: dataset.get(key)
                    for key in data_names
                    if key in dataset  # type: ignore[arg-type]
                    or key in ("name", "sha256")
                }
            ),
            extra={key: value for key, value in recorded.items() if key not in names | {"dataset", "package"}},
        )

    @property
    def cpu_model(self) -> str | None:
        """The CPU the run's rank 0 ran on, as ``system.hardware.describe`` names it (None where not recorded)."""
        cpu = (self.hardware or {}).get("cpu")
        return cpu.get("model") if isinstance(cpu, Mapping) else None


def _set_items(record: Any) -> dict[str, Any]:
    """A record's fields, those with a default only where set (older files lack them)."""
    return {
        one.name: getattr(record, one.name)
        for one in fields(record)
        if getattr(record, one.name) is not None or one.default is MISSING and one.default_factory is MISSING
    }


def collect(dataset: str, dataset_sha256: str | None, device: torch.device, precision: str) -> Provenance:
    """The record for this run; every process must call it (device names are gathered from all ranks).
    ``precision`` is what training computes in (fp32, bf16, fp16), ``hardware`` this process's CPU and GPUs."""
    return Provenance(
        package=PackageBuild(PACKAGE, package_version(), is_release(package_version()), **git_state()),
        versions={
            "python": platform.python_version(),
            "torch": str(torch.__version__),
            "torchvision": _installed_version("torchvision"),  # without importing it (a second at every start)
            "pytorch-ignite": ignite.__version__,
        },
        backend=idist.backend(),
        world_size=idist.get_world_size(),
        devices=device_names(device),
        precision=precision,
        hardware=hardware.describe(device),
        dataset=DataRecord(dataset, dataset_sha256),
    )


def describe(record: Provenance) -> str:
    """One log line: package version, git state and data checksum."""
    package = record.package
    git = "no git"
    if package.git_commit:
        git = f"git {package.git_commit[:10]}" + (" (dirty)" if package.git_dirty else "")
    build = " (a development build)" if package.release is False else ""
    return f"{package.name} {package.version}{build}, {git}, data sha256 {record.dataset.sha256}"


def package_version() -> str:
    """The running package's version (``cifar10_dist.__version__``, the one place it is written; read from the
    package already imported, not from installed metadata, which a checkout on PYTHONPATH lacks)."""
    return sys.modules["cifar10_dist"].__version__


def is_release(version: str) -> bool:
    """Whether a version is a release (1.2.0, 1.2.0rc1), not a development build between releases (PEP 440's
    ``.devN`` or a local ``+label``: the tree has changes the last release has not)."""
    return re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?", version) is not None


def _installed_version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def source_checkout() -> Path | None:
    """The checkout of this project the running package is (its own pyproject.toml beside the package, naming
    it), or None: a wheel installed anywhere, also inside someone else's git repository, is no checkout."""
    root = Path(__file__).resolve().parents[2]
    project = root / "pyproject.toml"
    try:
        names_us = f'name = "{PACKAGE}"' in project.read_text()
    except OSError:
        return None
    return root if names_us and (root / "cifar10_dist" / "__init__.py").is_file() else None


def git_state() -> dict[str, Any]:
    """Commit of this project's checkout the package runs from and whether tracked files differ from it; None
    for both when it runs from an installed copy (the version says what it is), outside git, or from a copy of the
    project (an unpacked sdist) inside another git repository, whose commits are not this project's."""
    folder = source_checkout()
    if folder is None:
        return {"git_commit": None, "git_dirty": None}

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != folder.resolve():  # a copy inside another project's repository
        return {"git_commit": None, "git_dirty": None}
    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"git_commit": None, "git_dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": commit, "git_dirty": bool(status) if status is not None else None}


def device_names(device: torch.device) -> dict[str, int]:
    """How many processes ran on each kind of device, e.g. {"NVIDIA A100-SXM4-40GB": 8}."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    elif device.type == "cpu":
        name = f"cpu: {hardware.cpu_model()}"
    else:
        name = str(device.type)
    names: Any = idist.all_gather(name) if idist.get_world_size() > 1 else [name]
    return {each: names.count(each) for each in sorted(set(names))}


def dataset_sha256(*tensors: Any) -> str:
    """SHA-256 of the tensors as loaded (a run's train images and labels, then its test images and labels):
    equal data, equal checksum, any source; images read on demand (``chunks``) are hashed a chunk at a time."""
    digest = hashlib.sha256()
    for tensor in tensors:
        for chunk in tensor.chunks() if hasattr(tensor, "chunks") else (tensor,):
            digest.update(chunk.contiguous().numpy())
    return digest.hexdigest()


def of_checkpoint(checkpoint: Mapping[str, Any]) -> Provenance:
    """The record a checkpoint's meta holds, read back as a ``Provenance`` (an older file's: what it has of it)."""
    return Provenance.from_dict(checkpoint_layout.recorded_provenance(checkpoint))


def differences(recorded: Provenance, present: Provenance) -> list[str]:
    """What differs between a checkpoint's record and the present run: package version, dataset checksum."""
    found = []
    then, now = recorded.package.version, present.package.version
    if then is not None and then != now:
        found.append(f"it was made with {PACKAGE} {then}, this is {now}")
    then, now = recorded.dataset.sha256, present.dataset.sha256
    if then is not None and now is not None and then != now:
        found.append(f"it was made with other data (sha256 {then[:12]}..., this data {now[:12]}...)")
    return found

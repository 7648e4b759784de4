"""A pretrained start (``pretrained``): a torchvision weights name (``DEFAULT``, ``IMAGENET1K_V1``, ...) for a
torchvision model, read from torch's hub cache (``TORCH_HOME``; fetched there once, before any worker starts), or
the path of a file: one of our training checkpoints or best-model files, a plain state-dict ``.pt``/``.pth``, or a
``.safetensors`` file (ours from ``export`` record their classes).

The model's head (its last ``nn.Linear``) is new whenever the weights were made for other classes, by count or by
name (five other classes are not the same five outputs); every other tensor must fit, or the run is refused in
one line naming the first that does not. The weights' own normalisation (torchvision's transforms, the one a run
of ours recorded) replaces the dataset's, so images are seen as the weights learned them.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import os
import re
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from cifar10_dist import checkpoint_layout
from cifar10_dist.config import TIMM_PREFIX
from cifar10_dist.errors import UserError

logger = logging.getLogger("cifar10_dist")

FILE_SUFFIXES = (".pt", ".pth", ".safetensors")
DOWNLOAD_TIMEOUT = 30  # seconds without an answer before a download counts as impossible (no network)


@dataclass(frozen=True)
class Weights:
    """Where a pretrained start comes from: ``kind`` torchvision (``name`` the weights' name, ``url``, ``path`` the
    cache file) or file (``path``); the classes its head was trained for and its normalisation, when known."""

    kind: str
    name: str
    path: str
    asked: str = ""  # the pretrained value as given (DEFAULT names IMAGENET1K_V1 for resnet18)
    url: str | None = None
    classes: tuple[str, ...] | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    @property
    def normalisation(self) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """(mean, std) the weights learned their images with, when known."""
        return (self.mean, self.std) if self.mean is not None and self.std is not None else None

    def describe(self) -> dict[str, Any]:
        """For provenance and the log: what it is, and the file's SHA-256 when it is there."""
        record = {"kind": self.kind, "name": self.name, **({"path": self.path} if self.path else {})}
        if self.url:
            record["url"] = self.url
        if self.path and Path(self.path).is_file():
            record["sha256"] = _sha256(Path(self.path))
        return record


def resolve(model_name: str, pretrained: str) -> Weights:
    """The weights ``pretrained`` names for ``model_name`` (nothing downloaded or read beyond a file's record),
    or one line saying what is accepted."""
    path = Path(pretrained).expanduser()
    if path.suffix in FILE_SUFFIXES or os.sep in pretrained or path.exists():
        if not path.is_file():
            raise UserError(
                f"pretrained='{pretrained}' does not exist: give a checkpoint, a best-model file, a "
                "state-dict .pt/.pth or a .safetensors file (or a torchvision weights name)"
            )
        classes, mean, std = _recorded(path)
        return Weights(
            "file", str(path.resolve()), str(path.resolve()), pretrained, classes=classes, mean=mean, std=std
        )
    if model_name.startswith(TIMM_PREFIX):
        if pretrained.lower() != "true":
            raise UserError(
                f"pretrained='{pretrained}' for model={model_name}: give true (timm's weights for its "
                "pretrained tag) or a file of weights"
            )
        return _timm_weights(model_name)
    return _torchvision_weights(model_name, pretrained)


def _timm_weights(model_name: str) -> Weights:
    """timm's pretrained weights for the name (and tag) through timm's own ``create_model``: its Hugging Face
    cache (HF_HOME), its normalisation (``pretrained_cfg``)."""
    from cifar10_dist.models.networks import require_timm

    timm = require_timm()
    config = timm.models.get_pretrained_cfg(model_name[len(TIMM_PREFIX) :]) or {}
    config = config if isinstance(config, dict) else config.to_dict()
    source = f"https://huggingface.co/{config['hf_hub_id']}" if config.get("hf_hub_id") else config.get("url")
    return Weights(
        "timm",
        model_name,
        "",
        "true",
        source,
        None,
        tuple(config.get("mean") or ()) or None,
        tuple(config.get("std") or ()) or None,
    )


def _torchvision_weights(model_name: str, name: str) -> Weights:
    import torchvision

    if model_name not in torchvision.models.list_models(module=torchvision.models):
        raise UserError(
            f"pretrained='{name}' is a weights name, which only torchvision models have "
            f"(model={model_name} is not one): give a file of weights instead, e.g. a best-model file"
        )
    enum = torchvision.models.get_model_weights(model_name)
    names = list(enum.__members__)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise UserError(
            f"pretrained='{name}' is not a weights name of {model_name}: {hint}choose one of "
            f"{', '.join(names)} (or give a file)"
        )
    weights = enum[name]
    transforms = weights.transforms()
    return Weights(
        "torchvision",
        f"{model_name} {weights.name}",
        str(cache_file(weights.url)),
        name,
        weights.url,
        tuple(weights.meta.get("categories") or ()),
        tuple(transforms.mean),
        tuple(transforms.std),
    )


def cache_file(url: str) -> Path:
    """Where torch's hub keeps the file of ``url`` (TORCH_HOME/hub/checkpoints/NAME)."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(url)


def fetch(weights: Weights) -> None:
    """Before any worker starts: a torchvision weights file is in the cache, downloaded now if it is not; without
    network, one line naming the file, its URL and where to place it."""
    if weights.kind == "timm":
        if _hugging_face_file(weights) is None:
            _refuse_without_network(weights)
            _download_to_hugging_face_cache(weights)  # the workers read it from there
        return
    target = Path(weights.path)
    if weights.kind != "torchvision" or target.is_file():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.part{os.getpid()}")
    try:
        with urllib.request.urlopen(str(weights.url), timeout=DOWNLOAD_TIMEOUT) as answer, partial.open("wb") as file:
            while chunk := answer.read(1 << 20):
                file.write(chunk)
        check_hash_prefix(partial, target.name, weights)
        partial.replace(target)  # complete or absent: a half-downloaded file is never used
    except OSError as error:
        raise UserError(
            f"pretrained={weights.asked}: {target.name} is not in torch's cache and cannot be "
            f"downloaded ({getattr(error, 'reason', error)}): download {weights.url} and place it at "
            f"{target} (TORCH_HOME chooses the cache)"
        ) from error
    finally:
        partial.unlink(missing_ok=True)
    logger.info("pretrained weights downloaded to %s", target)


HASH_PREFIX = re.compile(r"-([a-f0-9]{6,})\.")  # torchvision's weights files: NAME-<sha256 prefix>.pth (torch.hub's)


def check_hash_prefix(downloaded: Path, name: str, weights: Weights) -> None:
    """A downloaded file whose SHA-256 does not begin with the prefix its published name carries is refused in one
    line (the caller removes it): a download cut or altered on the way is never loaded."""
    found = HASH_PREFIX.search(name)
    if found is None:
        return
    digest = _sha256(downloaded)
    if not digest.startswith(found.group(1)):
        raise UserError(
            f"pretrained={weights.asked}: the file downloaded from {weights.url} has SHA-256 "
            f"{digest[:12]}..., and its name {name} says it begins with {found.group(1)}: it was not "
            "kept (a damaged or altered download); try again, or download it yourself and place it at "
            f"{weights.path}"
        )


def load(model: nn.Module, weights: Weights, classes: tuple[str, ...]) -> None:
    """Load the weights into ``model`` (built for ``classes``): every tensor but a head made for other classes,
    which stays as initialised; one INFO line says which layer is new. A tensor that does not fit is refused."""
    found = _strip_prefixes(_read(weights))
    state = model.state_dict()
    head_name, head = head_of(model)
    head_tensors = [f"{head_name}.{key}" for key, _ in head.named_parameters()] if head is not None else []
    other_classes = weights.classes is not None and len(weights.classes) > 0 and tuple(weights.classes) != classes
    new = [
        name for name in head_tensors if other_classes or name not in found or found[name].shape != state[name].shape
    ]
    _check_fit(state, found, set(new), weights)
    model.load_state_dict({name: state[name] if name in new else found[name] for name in state})
    if new:
        was = tuple(found[new[0]].shape) if new[0] in found else "absent"
        why = f"{len(weights.classes)} other classes" if other_classes and weights.classes else f"another shape ({was})"
        logger.info(
            "pretrained %s: layer %s replaced for the run's %d classes (the weights' head has %s); new "
            "tensors: %s; %d loaded",
            weights.name,
            head_name,
            len(classes),
            why,
            ", ".join(new),
            len(state) - len(new),
        )
    else:
        logger.info("pretrained %s: all %d tensors loaded (head included: same classes)", weights.name, len(state))


def head_of(model: nn.Module) -> tuple[str, nn.Module | None]:
    """The classifier head: the model's last ``nn.Linear`` (``fc``, ``classifier.3``, ``heads.head``, ...)."""
    linear = [(name, module) for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    return linear[-1] if linear else ("", None)


def _check_fit(
    state: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor], new: set[str], weights: Weights
) -> None:
    missing = [name for name in state if name not in found and name not in new]
    unexpected = [name for name in found if name not in state]
    mismatched = [
        name for name in state if name in found and name not in new and found[name].shape != state[name].shape
    ]
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if mismatched:
        name = mismatched[0]
        parts.append(
            f"{len(mismatched)} tensors of another shape, first {name}: {tuple(found[name].shape)} there, "
            f"{tuple(state[name].shape)} here"
        )
    if missing:
        parts.append(f"{len(missing)} tensors of the model missing, first {missing[0]}")
    if unexpected:
        parts.append(f"{len(unexpected)} tensors the model lacks, first {unexpected[0]}")
    raise UserError(
        f"pretrained {weights.name} does not fit this model: {'; '.join(parts)} (another model or model_kwargs?)"
    )


HUB_FILES = ("model.safetensors", "pytorch_model.bin")  # what timm fetches from a Hugging Face repository


def hugging_face_cache() -> Path:
    """The Hugging Face hub cache, read from the environment now (HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub), not when huggingface_hub was imported."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def _repository(weights: Weights) -> str:
    return weights.url.removeprefix("https://huggingface.co/") if weights.url else ""


def _hugging_face_file(weights: Weights) -> str | None:
    """The weights' file in the Hugging Face cache (HF_HOME/hub), or None."""
    from huggingface_hub import try_to_load_from_cache

    for name in HUB_FILES:
        found = (
            try_to_load_from_cache(_repository(weights), name, cache_dir=hugging_face_cache())
            if _repository(weights)
            else None
        )
        if isinstance(found, str):
            return found
    return None


def _download_to_hugging_face_cache(weights: Weights) -> None:
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(_repository(weights), HUB_FILES[0], cache_dir=hugging_face_cache())
    except Exception as error:  # huggingface_hub's errors: no such file, no network after all
        raise UserError(_unreachable(weights, f"{type(error).__name__}: {str(error).splitlines()[0][:160]}")) from error
    logger.info("pretrained weights of %s downloaded to the Hugging Face cache", weights.name)


def _refuse_without_network(weights: Weights) -> None:
    """One line at once when the weights' host cannot be reached (huggingface_hub would retry for a minute)."""
    try:
        urllib.request.urlopen(urllib.request.Request(weights.url or "", method="HEAD"), timeout=DOWNLOAD_TIMEOUT)
    except OSError as error:
        raise UserError(_unreachable(weights, getattr(error, "reason", error))) from error


def _unreachable(weights: Weights, reason: Any) -> str:
    return (
        f"pretrained=true: the weights of {weights.name} are not in the Hugging Face cache (HF_HOME) and cannot be "
        f"downloaded ({reason}): download {weights.url} (model.safetensors) and give --pretrained=THAT_FILE"
    )


def _timm_state(weights: Weights) -> Mapping[str, torch.Tensor]:
    """timm's pretrained weights for the name, loaded by timm itself (its key mapping and filters) from the file
    the launcher put in the Hugging Face cache: no network in the workers."""
    from cifar10_dist.models.networks import require_timm

    cached = _hugging_face_file(weights)
    if cached is None:
        raise UserError(_unreachable(weights, "not fetched before the workers started"))
    return (
        require_timm()
        .create_model(weights.name[len(TIMM_PREFIX) :], pretrained=True, pretrained_cfg_overlay={"file": cached})
        .state_dict()
    )


def _read(weights: Weights) -> Mapping[str, torch.Tensor]:
    if weights.kind == "timm":
        return _timm_state(weights)
    path = Path(weights.path)
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(
            f"pretrained {weights.name} cannot be read: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
        ) from error
    try:  # a training checkpoint of a run with ema_decay: the EMA's, the weights it evaluates
        return checkpoint_layout.model_weights(loaded if isinstance(loaded, Mapping) else {}, prefer_ema=True)
    except UserError:
        raise UserError(
            f"pretrained {weights.name} holds no model weights (expected a state dict, or a "
            "checkpoint with a 'model' entry)"
        ) from None


WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DDP's, torch.compile's


def _strip_prefixes(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Names as a plain model has them: DDP's ``module.`` and torch.compile's ``_orig_mod.`` removed, in whichever
    order the wrappers were applied."""
    stripped = {}
    for name, tensor in tensors.items():
        while name.startswith(WRAPPER_PREFIXES):
            name = name.split(".", 1)[1]
        stripped[name] = tensor
    return stripped


def _recorded(path: Path) -> tuple[tuple[str, ...] | None, tuple[float, ...] | None, tuple[float, ...] | None]:
    """The classes and normalisation a file records: ours (a checkpoint's provenance, an exported safetensors
    file's metadata); (None, None, None) for plain tensors."""
    info: Mapping[str, Any] | None = None
    if path.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), "pt") as file:
            metadata = json.loads((file.metadata() or {}).get("cifar10_dist", "{}"))
        info = metadata if "classes" in metadata else None
    else:
        try:
            loaded = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:
            return None, None, None  # read again (and refused in one line) when the weights are loaded
        info = checkpoint_layout.recorded_data_info(loaded) if isinstance(loaded, Mapping) else None
    if not info:
        return None, None, None
    return tuple(info["classes"]), tuple(info["mean"]), tuple(info["std"])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()

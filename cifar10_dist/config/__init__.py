"""The run configuration: a frozen, typed dataclass whose fields carry their defaults, help texts, own rules and
roles (``fields`` composes them from their topics: ``data_keys``, ``augmentation_keys``, ``training_keys``,
``speed_keys``, ``output_keys``, ``launch_keys``, each field declared with ``options``; a tuning trial's spec:
``trial``; lr-find's sweep: ``lr_sweep``), the rules that tie keys
together and the typed values parsed from text (``rules``), building one from defaults, a YAML file and overrides,
and the options' help (``loading``), which file a ``--config`` names and reading it strictly (``yaml_files``), and
every command's own flags, declared once (``commands``). Plain data: it
imports nothing heavier than PyYAML, and only ``sources`` (the dataset names) and ``errors`` below it; checks
against the filesystem, the model registry and the launch environment are ``preflight``'s."""

from cifar10_dist.config.fields import (
    FIELDS,
    INHERITED_BY_EVALUATE,
    MAY_CHANGE_ON_RESUME,
    ONLY_WITH,
    PER_TUNING_WORKER,
    RENAMED,
    UNTUNABLE,
    Config,
    choices,
    takes_effect,
)
from cifar10_dist.config.launch_keys import NATIVE_BACKENDS
from cifar10_dist.config.loading import load_config, located_in_its_file, note
from cifar10_dist.config.lr_sweep import SUGGESTION_RULES, LrSweep
from cifar10_dist.config.options import Bounds
from cifar10_dist.config.rules import (
    MODEL_REFERENCE,
    TIMM_PREFIX,
    ClassWeights,
    absolute_model_reference,
    class_weights,
    is_model_reference,
    milestone_epochs,
    per_batch_augmentations,
    planned_world_size,
    validate,
)
from cifar10_dist.config.trial import PRUNERS, PrunerSpec, TrialSpec
from cifar10_dist.config.yaml_files import ConfigSource, YamlMapping, config_path, read_yaml_file, shipped_configs

__all__ = [
    "NATIVE_BACKENDS",
    "ConfigSource",
    "LrSweep",
    "SUGGESTION_RULES",
    "FIELDS",
    "INHERITED_BY_EVALUATE",
    "MAY_CHANGE_ON_RESUME",
    "ONLY_WITH",
    "takes_effect",
    "PER_TUNING_WORKER",
    "PRUNERS",
    "UNTUNABLE",
    "RENAMED",
    "Bounds",
    "Config",
    "PrunerSpec",
    "TrialSpec",
    "choices",
    "load_config",
    "located_in_its_file",
    "note",
    "read_yaml_file",
    "YamlMapping",
    "config_path",
    "shipped_configs",
    "MODEL_REFERENCE",
    "absolute_model_reference",
    "ClassWeights",
    "class_weights",
    "is_model_reference",
    "TIMM_PREFIX",
    "milestone_epochs",
    "per_batch_augmentations",
    "planned_world_size",
    "validate",
]

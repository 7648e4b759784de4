"""Models: the networks by name (``networks``: torchvision's, CIFAR ResNets, airbench, simple_cnn, your own
factories), the traits a recipe asks a model for (``traits``: protocols, never a concrete class) and a
pretrained start for them (``pretrained``: torchvision's weights from the standard cache, or a
file of our own or of plain tensors, with a new head for the run's classes), a model rebuilt from a checkpoint of
ours (``restoring``) and how a trained model is read (``viewing``: test-time views, a fitted temperature). Imports
``checkpoint_layout``, ``config`` and ``errors`` only; nothing here knows about data or launching."""

from cifar10_dist.models.networks import (
    CIFAR_RESNETS,
    NUM_CLASSES,
    REGISTRY,
    AirbenchNet,
    available_models,
    build_model,
    check_model,
    check_model_name,
    cifar_resnet,
    count_parameters,
    import_factory,
    register_model,
    simple_cnn,
    torchvision_models,
    unwrap,
)
from cifar10_dist.models.traits import (
    WhitenedFromData,
    is_whitened_from_data,
    missing_whitening_parts,
    whitening_bias,
    whitening_images,
)

__all__ = [
    "CIFAR_RESNETS",
    "NUM_CLASSES",
    "REGISTRY",
    "register_model",
    "AirbenchNet",
    "available_models",
    "build_model",
    "check_model",
    "check_model_name",
    "cifar_resnet",
    "count_parameters",
    "import_factory",
    "simple_cnn",
    "torchvision_models",
    "unwrap",
    "WhitenedFromData",
    "is_whitened_from_data",
    "missing_whitening_parts",
    "whitening_bias",
    "whitening_images",
]

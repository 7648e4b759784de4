"""How a trained model is read: its logits averaged over test-time views (``tta_logits``), and divided by a
fitted temperature (``TemperatureScaled``); shared by the evaluators of a run, ``evaluate``, ``predict`` and
``export``."""

from __future__ import annotations

import torch
from torch import nn


def tta_logits(model: nn.Module, inputs: torch.Tensor, tta: int = 0) -> torch.Tensor:
    """Logits, averaged over test-time views: 0 the image only, 1 also its mirror, 2 also both of them shifted by
    one pixel up-left and down-right (reflect padding), weighted as in airbench (half unshifted, half shifted)."""
    if tta == 0:
        return model(inputs)
    mirrored = 0.5 * model(inputs) + 0.5 * model(inputs.flip(-1))
    if tta == 1:
        return mirrored
    size = inputs.shape[-1]
    padded = nn.functional.pad(inputs, (1, 1, 1, 1), mode="reflect")
    # dense copies in the inputs' layout: a compiled model sees the strides it was compiled for, not a slice's
    # (which recompiled it, once before the whitening bias froze and once after)
    shifted = [
        view.clone(memory_format=torch.preserve_format) for view in (padded[..., :size, :size], padded[..., 2:, 2:])
    ]
    shifted_logits = [0.5 * model(view) + 0.5 * model(view.flip(-1)) for view in shifted]
    return 0.5 * mirrored + 0.25 * (shifted_logits[0] + shifted_logits[1])


class TemperatureScaled(nn.Module):
    """``model``'s logits divided by ``temperature`` (what evaluate, predict and export run when a checkpoint
    carries one)."""

    def __init__(self, model: nn.Module, temperature: float) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("temperature", torch.tensor(float(temperature)))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs) / self.temperature

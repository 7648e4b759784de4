"""A backbone frozen part-way through a fine-tuning run, decided from the iteration alone, so a run resumed inside or
after the frozen part is exact (a recipe's own freezes are its parts: ``recipes``).

- ``BackboneFreeze``: the first ``freeze_epochs`` of a fine-tuning run, the head (the model's last Linear) trains
  alone. The backbone's learning rate is 0 then (``schedules.GroupSchedule.train_from``, so its weights do not move,
  exactly), and its BatchNorm layers are kept in eval mode, so their running statistics do not move either."""

from __future__ import annotations

from ignite.engine import Engine, Events
from torch import nn

from cifar10_dist import models
from cifar10_dist.models.pretrained import head_of
from cifar10_dist.training.loop.step import TrainStep


class BackboneFreeze:
    """Keeps the backbone's BatchNorm layers in eval mode up to iteration ``until`` (with the step, which puts
    them back after each ``model.train()``), and in train mode from the next one on."""

    def __init__(self, model: nn.Module, step: TrainStep, until: int) -> None:
        network = models.unwrap(model)
        head_name, _ = head_of(network)
        self.norms: list[nn.Module] = [
            module
            for name, module in network.named_modules()
            if isinstance(module, nn.modules.batchnorm._BatchNorm)
            and name != head_name
            and not name.startswith(head_name + ".")
        ]
        self.step, self.until = step, until

    def attach(self, trainer: Engine) -> None:
        """Acts at the iterations up to the thaw, and not after it."""
        up_to_the_thaw = Events.ITERATION_STARTED(event_filter=lambda _, iteration: iteration <= self.until + 1)
        trainer.add_event_handler(up_to_the_thaw, self)

    def __call__(self, engine: Engine) -> None:
        frozen = engine.state.iteration <= self.until
        self.step.frozen_norms = self.norms if frozen else []
        for norm in self.norms:
            norm.train(not frozen)

"""Parameters frozen part-way through a run, each decided from the iteration alone, so a run resumed inside or after
the frozen part is exact.

- ``BackboneFreeze``: the first ``freeze_epochs`` of a fine-tuning run, the head (the model's last Linear) trains
  alone. The backbone's learning rate is 0 then (``schedules.GroupSchedule.train_from``, so its weights do not move,
  exactly), and its BatchNorm layers are kept in eval mode, so their running statistics do not move either.
- ``WhiteningBiasFreeze``: the airbench whitening bias after its ``whitening_bias_epochs``, when its learning rate
  is 0 for good: its gradient is no longer computed (``whitening_bias_frozen``), which spares the
  backward pass the first conv group's input gradient and the activation before it; every weight moves as before."""

from __future__ import annotations

from typing import Any

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
        self.norms = [module for name, module in network.named_modules()
                      if isinstance(module, nn.modules.batchnorm._BatchNorm)
                      and name != head_name and not name.startswith(head_name + ".")]
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


class WhiteningBiasFreeze:
    """Sets ``whitening_bias_frozen`` on a model whitened from data (``models.WhitenedFromData``) at each
    iteration: true after iteration ``until`` where the bias's param group has lr 0 (its schedule keeps it 0 from
    then on), read after the LR scheduler has set this iteration's lr."""

    def __init__(self, network: models.WhitenedFromData, optimizer: Any, until: int) -> None:
        bias = network.whiten.bias
        self.index = next(index for index, group in enumerate(optimizer.param_groups)
                          if any(p is bias for p in group["params"]))
        self.optimizer, self.network, self.until = optimizer, network, until  # (a resume replaces the group dicts)

    @classmethod
    def attach_where_whitened(cls, trainer: Engine, model: nn.Module, optimizer: Any, until: int) -> None:
        """Attached (after the LR scheduler) where the model is whitened from data with a trained bias."""
        network = models.unwrap(model)
        bias = models.whitening_bias(network)
        if bias is not None and bias.requires_grad:
            trainer.add_event_handler(Events.ITERATION_STARTED, cls(network, optimizer, until))

    def __call__(self, engine: Engine) -> None:
        lr = self.optimizer.param_groups[self.index]["lr"]
        self.network.whitening_bias_frozen = engine.state.iteration > self.until and lr == 0

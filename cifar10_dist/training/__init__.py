"""What runs inside a training process: ``run`` (one training process, read top-down) above four rooms by phase,
layered so that each imports only the ones below it (each subpackage's ``__init__`` names its modules):

- ``setup`` (lowest): the process, the resume decision, the model, the memory layout, the optimizer, its schedule
  and the loss, built once;
- ``loop``: one training step, the evaluators, the run's engines and the validation after an epoch, weight
  averages, freezing, data selection, the warm-up, checkpoints written and resumed, a trial's in-run reporting,
  and the run's end;
- ``before_training``: the tools run before a run: the learning-rate sweep, the batch-size finder, the profiler;
- ``trained_models``: what is done with trained models: a teacher's soft targets (distillation), temperature
  scaling fitted on a trained model, and evaluating a saved model in every process.

Imports ``data``, ``outputs``, ``system`` and the floors below them."""

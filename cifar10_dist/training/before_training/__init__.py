"""The tools run before training, each a command of its own:

- ``lr_finding``: the learning-rate sweep (``lr-find``, ``learning_rate=find``);
- ``batch_sizes``: the batch-size finder (``batch-size``);
- ``profiling``: the profiler of a run's first iterations (``profile=N``)."""

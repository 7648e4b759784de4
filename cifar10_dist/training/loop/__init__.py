"""The training loop and what runs in it (``training.run`` drives it):

- ``step``: one training step (``TrainStep``: forward, backward, accumulation, clipping, the optimizer step);
- ``evaluators``: the evaluation engines and their metrics (the mistakes kept in passing);
- ``validation``: the run's engines (``EngineSet``) and the evaluation after an epoch (``Validation``);
- ``averaging``: weight averages (EMA);
- ``freezing``: freezing a backbone for some epochs;
- ``selection``: training on the hardest part of each batch (data selection);
- ``checkpointing``: checkpoints written, pruned and resumed, and the checks before a resume;
- ``background_writes``: training checkpoints copied to host memory and written on a thread of their own;
- ``trials``: a tuning trial's in-run reporting and pruning;
- ``warm_up``: steps before the timed training, undone;
- ``run_end``: the end of a run (memory, mistakes, reliability, metrics.json, summary.json, curves)."""

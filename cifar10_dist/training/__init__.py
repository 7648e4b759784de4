"""What runs inside a training process: the worker that reads top-down (``worker``), its process set-up
(``process_setup``), the model it trains (``model_setup``: shared with the lr sweep), the training loss
(``loss``), one training step (``step``: ``TrainStep``), the evaluators (``evaluators``), the end of a run (``run_end``: summary, mistakes, curves), weight averages (``averaging``),
optimizers and LR schedules, checkpoints written and resumed (``checkpointing``), evaluating a saved model in every
process (``checkpoint_evaluation``), and a tuning trial's in-run reporting (``trials``). Imports ``data``, ``outputs``,
``system`` and the floors below them."""

"""What a run leaves on disk and reads back: atomic file writes (``files``), the run folder and its lock
(``run_folder``), checkpoint file names and safe loading (``checkpoint_files``), the log (``log_lines``, ``run_log``),
progress and each epoch's timing (``progress``), the local record of the scalars (``scalars``: TensorBoard,
metrics.jsonl), memory (``memory_use``), the trackers behind one interface (``trackers``, ``tracker_guard``,
``clearml_tracking``, ``mlflow_tracking``, ``wandb_tracking`` and ``wandb_history``: what W&B recorded), provenance,
summary.json (``summary``), reading finished runs back (``reading``: metrics.jsonl, summary.json, comparisons), their
pictures (``plots``), the mistakes picture (``mistake_grid``) and what ``evaluate`` writes (``evaluation_files``).
Imports ``system`` and the floors below it."""

"""What a run leaves on disk and reads back: atomic file writes (``files``), the run folder and its lock
(``run_folder``), checkpoint file names and safe loading (``checkpoint_files``), logs, progress and the local record
(``tracking``), the trackers behind one interface (``trackers``, ``tracker_guard``, ``clearml_tracking``,
``mlflow_tracking``, ``wandb_tracking`` and ``wandb_history``: what W&B recorded), provenance, summary.json (``summary``), reading finished runs back
(``reading``: metrics.jsonl, summary.json, comparisons), their pictures (``plots``), the mistakes picture
(``mistake_grid``) and what ``evaluate`` writes (``evaluation_files``). Imports ``system`` and the floors below
it."""

"""What a run leaves on disk and reads back: atomic file writes (``files``), the run folder and its lock
(``run_folder``), checkpoint file names and safe loading (``checkpoint_files``), logs, progress and the local record
(``tracking``), the trackers behind one interface (``trackers``, ``tracker_guard``, ``clearml_tracking``,
``mlflow_tracking``, ``wandb_tracking``), provenance, and reading finished runs back (``reading``: summary.json, metrics.jsonl, curves,
comparisons). Imports ``system`` and the floors below it."""

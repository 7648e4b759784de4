"""Hyperparameter tuning with Optuna: the study and its trials, which are ordinary runs (``studies``), the search
space (``search_space``), and how a study is shown (``reporting``). Imports ``runs`` and the floors below it
(a trial's reporting from inside its run is ``training.loop.trials``)."""

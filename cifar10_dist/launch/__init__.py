"""How processes start: every launch through Ignite's ``idist.Parallel`` (``spawn``), what Parallel lacks as small
wrappers around it (``supervision``), how spawned workers start (``start_method``), a failed launch's one line
(``failures``), and Ignite's compatibility with current torch-xla (``xla_compat``). The runs that launch are
``cifar10_dist.runs``, and their checks before launching are ``cifar10_dist.preflight``. Imports ``outputs``,
``system``, ``config`` and ``errors``; the worker function comes from the caller (the forkserver preloads
``training.run`` by name)."""

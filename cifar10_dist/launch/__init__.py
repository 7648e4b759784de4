"""Starting runs: the entry points (``runs``: resolve, train, train_seeds, evaluate), the checks of a config
against the world before any process starts (``preflight``), spawning and supervising processes under every
launcher (``spawn``), and ignite's compatibility with current torch-xla (``xla_compat``). Imports ``training`` and
the floors below it."""

"""Images in: the records every source produces (``records``), CIFAR-10/100 on disk (``cifar``), synthetic data
(``synthetic``), labelled image folders (``folder_scan``: found, checked, fingerprinted, decoded; ``cache_builds``:
decoded once into a cache, resumably, or staged on a node's disk; ``folder_source``: read as a run's images), a
run's data set up (``run_data``: images, hold-out, loaders, class counts, provenance), the loaders (``loaders``),
augmentation on the device (``augmentation``) and batches prepared for the model (``batches``). Imports
``outputs``, ``system`` and the floors below them; nothing here knows models or the command line."""

"""The benchmarks, run by hand from the repository root as ``python -m benchmarks.<name> --help``; each module's
docstring opens with what it measures, on which machine it was last run, how many runs and how long it takes.

    throughput   images per second: bare loop, our trainer, full epochs (1 and 2 processes), a torchvision
                 pipeline, evaluation; --variants, --profile, --loops
    overhead     microseconds per iteration our trainer adds to a bare loop, handler by handler
    recipes      airbench94's own code next to configs/fast.yaml and fast_muon.yaml, trained to the end
    tutorial     the Ignite CIFAR-10 tutorial's script next to ``cifar10-dist run``
    ddp          what DistributedDataParallel itself costs over gloo
    predict      how fast ``predict`` classifies image files
    folder       CIFAR-10 as an image folder against its pickle copy: cache build time, fast.yaml on each
    options      the recipe options (AdamW, cosine, step, TrivialAugment, MixUp/CutMix, clipping) next to the default
    augment_cost microseconds per image of each training-batch transform
    gpu          bare loop vs trainer per speed setting, real epochs, fast.yaml vs airbench94 on a GPU
    gpu_report   gpu_report.md/json from what scripts/gpu_check.sh left in its folder

Shared pieces: ``runner`` (our run through ``api.train`` in a fresh process, read back through ``outputs.reading``),
``peer`` (airbench94's train94 in its own process, on a CPU or a GPU), ``steps`` (the bare training step and
loops), ``records`` (the machine, the commit, JSON files). Figures in docs/measurements/ come from these.
"""

"""The benchmarks, run by hand from the repository root as ``python -m benchmarks.<name> --help``; each module's
docstring opens with what it measures, on which machine it was last run, how many runs and how long it takes.
Figures in docs/measurements/ come from these (docs/measured.md lists what each one found).

Recipes and accuracy, against peers
    tutorial         the Ignite CIFAR-10 tutorial's script next to ``cifar10-dist run``, over seeds
    recipes          airbench94's own code next to configs/fast*.yaml, trained to the end
    options          the recipe options (AdamW, cosine, step, TrivialAugment, MixUp/CutMix, no clipping)
    levers_folder    the work-cutting levers (progressive resizing, data selection) on a folder at 64 px
    transfer         what a pretrained start gains on a small dataset of one's own
    distillation     a small student with and without a teacher at the same budget
    imbalance        class_weights=auto and sampler=balanced on a long-tailed CIFAR-10
    calibration      test ECE and NLL before and after calibrate=temperature
    tta              what each test-time augmentation level buys and costs
    lr_find          what lr-find suggests against the recipes' own learning rates
    bisect           on a GPU: the commit that cost fast.yaml its accuracy, and each suspect's A/B at this checkout
Speed of training
    throughput       images per second: bare loop, our trainer, full epochs, a torchvision pipeline, evaluation
    overhead         microseconds per iteration our trainer adds to a bare loop, handler by handler
    ddp              what DistributedDataParallel itself costs over gloo
    compression      gradient compression between two nodes on a 1 Gbit/s and a 100 Mbit/s link, and the estimate
    checkpoint_writes what a training checkpoint holds the loop, written inline against in the background
    layouts          channels_last against the default layout, per model and precision
    gpu              bare loop vs trainer per speed setting, real epochs, fast.yaml vs airbench94 on a GPU
    gpu_report       gpu_report.md/json from what scripts/gpu_check.sh left in its folder
Input pipeline and data
    pipeline         images per second per core at 224 px: ours against torchvision's ImageFolder + PIL
    pipeline_training the input pipeline end to end on photos, as a user meets it
    augment_cost     microseconds per image of each training-batch transform
    crops            random-resized crops per image against one batched kernel
    folder           CIFAR-10 as an image folder against its pickle copy
Numerics
    layout_numerics  channels-last's fp32 error against the contiguous layout's, both against float64
Tools and shipping
    evaluate_passes  ``evaluate`` timed in two checkouts side by side
    predict          how fast ``predict`` classifies image files
    int8             int8 ONNX against fp32 in ONNX Runtime: speed and agreement
    int8_calibration every int8 calibration per trained model: held-out and test agreement, the choice
    doctor           ``cifar10-dist doctor``'s report, recorded
    tool_outputs     the real output of lr-find, batch-size and a profiled run, for the docs
    suite            README's two command lines timed on a fresh clone (CI's run and the demo)
    served_children  the CPU of a process the tests' CLI server forks, in two checkouts side by side

Shared pieces: ``two_hosts`` (two network namespaces joined by a rate-limited link), ``gpu_tables`` (the GPU
benchmark's record and race table), ``gpu_resnet`` (its resnet part), ``runner`` (our run through ``api.train`` in a
fresh process, read back through ``outputs.reading``), ``peer`` (airbench94's train94 in its own process, on a CPU
or a GPU), ``steps`` (the bare training step and loops), ``records`` (the machine, the commit, JSON files).
"""

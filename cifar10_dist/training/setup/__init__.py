"""A run's set-up, built once before the loop:

- ``plan``: the planner, every ``auto`` decided at once (``plan.settle``) before anything is built;
- ``config_fitting``: the planner's torch-free part, a file's or the default's values fitted to the run;
- ``process_setup``: the process (device, threads, precision) and a second Ctrl-C;
- ``resumption``: whether the run continues and from which checkpoint, decided once;
- ``model_setup``: the model, its pretrained start and its forward (shared by ``training.run`` and the lr sweep);
- ``layouts``: channels_last for the model and device (auto: measured numerics on a CPU);
- ``compression``: grad_compression's DDP hook and its checkpointed state;
- ``optimizers``: the optimizer and its parameter groups (SGD, AdamW, Muon, LARS-style scales);
- ``schedules``: the learning-rate schedule of every group;
- ``loss``: the training loss (label smoothing, class weights)."""

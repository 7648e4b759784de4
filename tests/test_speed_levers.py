"""The GPU step's levers and the device path's fixes, where a CPU can check them: a whole pass augmented at once
(the same crops whatever an image's place, exact resume, refusals), bf16 weights with fp32 normalisation, the
fused optimizer's choice, lookahead in two foreach launches with the same numbers, the warm-up compiling both of
the airbench forward's branches, the normalisation constants and the batched crops without a host wait, a
data_on_device choice agreed by every rank, and host waits filed under the iteration that made them."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from cifar10_dist import checkpoint_layout, models, recipes
from cifar10_dist.config import load_config
from cifar10_dist.data import augmentation, batches, loaders
from cifar10_dist.data.datasets import MEAN, STD, DatasetInfo, ImageSet
from cifar10_dist.recipes.lookahead import Lookahead
from cifar10_dist.system.precision import Precision
from cifar10_dist.training.loop import warm_up
from cifar10_dist.training.loop.step import TrainStep
from cifar10_dist.training.setup import model_setup, optimizers
from tests.conftest import TINY, assert_same_training_state, run_in_this_process

CLASSES = tuple("abcdefghij")
CPU = torch.device("cpu")
PER_PASS = [
    "--data_on_device=True",
    "--augment_per_pass=True",
    "--crop_padding=2",
    "--crop_pad_mode=reflect",
    "--flip=alternating",
]


def pass_augmentation(images: int, dtype: torch.dtype = torch.float32) -> batches.PassAugmentation:
    config = batches.TrainAugmentation.of(load_config(None, crop_padding=2, crop_pad_mode="reflect", flip="random"))
    return batches.pass_augmentation(config, images, DatasetInfo(CLASSES), dtype)


def test_a_pass_cuts_each_image_the_same_way_whatever_its_place_and_as_the_batch_path_cuts_it():
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (40, 3, 32, 32), dtype=torch.uint8, generator=generator)
    augment = pass_augmentation(40)
    order = torch.randperm(40, generator=generator)
    whole = augment(images[order], order, epoch=3)
    tail = augment(images[order[25:]], order[25:], epoch=3)  # a pass resumed at position 25
    assert torch.equal(whole[25:], tail)
    by_index = torch.empty_like(whole)
    by_index[order] = whole
    assert torch.equal(by_index, augment(images, torch.arange(40), epoch=3))  # the place does not matter
    assert not torch.equal(whole, augment(images[order], order, epoch=4))  # another epoch draws anew
    # the cut itself is augment's: the same offsets and flips drawn for all 40 give the same images
    drawn = torch.Generator().manual_seed(batches.iteration_seed(augment.seed, batches.PASS_STREAM, 3))
    cut = augmentation.augment(images, drawn, 2, "reflect", "random")
    assert torch.equal(by_index, augmentation.normalize(cut).contiguous(memory_format=torch.channels_last))


def test_a_pass_is_normalised_once_in_the_training_dtype_and_batches_are_its_slices():
    train, test = (
        ImageSet(torch.randint(0, 256, (64, 3, 32, 32), dtype=torch.uint8), torch.arange(64) % 10),
        ImageSet(torch.zeros(8, 3, 32, 32, dtype=torch.uint8), torch.zeros(8, dtype=torch.long)),
    )
    made = loaders.make_loaders(
        train,
        test,
        batch_size=16,
        num_workers=0,
        train_eval_size=0,
        seed=0,
        device=CPU,
        pass_transform=pass_augmentation(64, torch.bfloat16),
    )
    config = batches.TrainAugmentation.of(load_config(None))
    prepare = batches.train_batch_preparer(CPU, config, 4, DatasetInfo(CLASSES), prepared_per_pass=True)
    got = [prepare(batch, iteration) for iteration, batch in enumerate(made.train, start=1)]
    dataset = made.train.dataset
    assert len(got) == 4 and all(inputs.dtype == torch.bfloat16 for inputs, _ in got)
    assert torch.equal(torch.cat([inputs for inputs, _ in got]), dataset.prepared_pass[1])
    assert got[0][0].is_contiguous(memory_format=torch.channels_last)
    order = dataset.prepared_pass[0]
    assert torch.equal(torch.cat([labels for _, labels in got]), train.labels[order])


def test_a_run_augmented_per_pass_resumes_mid_epoch_bit_for_bit_and_trains(small_dataset, tmp_path):
    common = [*TINY, *PER_PASS, f"--data_path={small_dataset}", f"--output_path={tmp_path}"]
    whole = run_in_this_process("run", *common, "--checkpoint_every=25", "--run_name=whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "augment_per_pass: each pass's crops and flips cut at its start, normalised in fp32" in whole.stderr
    assert "augment_per_pass: true" in (tmp_path / "whole" / "config.yaml").read_text()
    resumed = run_in_this_process(
        "run", *common, "--run_name=resumed", f"--resume_from={tmp_path / 'whole' / 'training_checkpoint_25.pt'}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = max((tmp_path / "whole").glob("training_checkpoint_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    assert_same_training_state(final, tmp_path / "resumed" / final.name)
    accuracy = json.loads((tmp_path / "whole" / "metrics.json").read_text())["test"]["accuracy"]
    assert accuracy > 0.15  # 10 classes: it learned


@pytest.mark.parametrize(
    "flags, refusal",
    [
        (
            ["--augment_per_pass=True", "--data_on_device=False"],
            "augment_per_pass=True cuts each pass on the training device: it needs data_on_device=True (or auto)",
        ),
        (
            ["--augment_per_pass=True", "--color_jitter=0.1", "--mixup_alpha=0.2"],
            "augment_per_pass=True cuts pad-crops and flips only, and color_jitter=0.1, mixup_alpha=0.2 augments "
            "batch by batch: leave augment_per_pass=auto (it is then off) or turn those off",
        ),
        (
            ["--low_precision_weights=True", "--with_amp=False"],
            "low_precision_weights=True keeps the weights in bf16: it needs bf16 training (with_amp=auto or True with "
            "amp_dtype=bfloat16), not with_amp=False, amp_dtype=auto",
        ),
    ],
)
def test_a_lever_that_cannot_apply_is_refused_in_one_line_before_anything_starts(flags, refusal, tmp_path):
    result = run_in_this_process("run", *TINY, *flags, f"--output_path={tmp_path}", "--dataset=synthetic")
    assert result.returncode == 2 and result.stderr.strip().splitlines()[-1].endswith(refusal), result.stderr[-500:]
    assert not any(tmp_path.iterdir())


def test_auto_cuts_per_pass_on_a_cuda_gpu_with_the_images_there_and_no_per_batch_augmentation():
    settle = batches.settle_augment_per_pass
    assert settle("auto", torch.device("cuda"), True, []) and not settle("auto", CPU, True, [])
    assert not settle("auto", torch.device("cuda"), False, []) and not settle(
        "auto", torch.device("cuda"), True, ["color_jitter=0.1"]
    )
    with pytest.raises(Exception, match="and the images stay in host memory"):
        settle(True, torch.device("cuda"), False, [])


def test_half_weights_keep_normalisation_in_fp32_train_in_bf16_and_checkpoint_for_fp32_models(small_dataset, tmp_path):
    model = models.build_model("airbench")
    model_setup.half_network(model, Precision("cpu", torch.bfloat16))
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert model.whiten.weight.dtype == model.head.weight.dtype == model.layers[1][0].weight.dtype == torch.bfloat16
    assert len(norms) == 6 and {t.dtype for m in norms for t in (m.weight, m.bias, m.running_var)} == {torch.float32}
    with pytest.raises(
        Exception, match="low_precision_weights=True keeps the weights in bf16, and this run trains in fp32"
    ):
        model_setup.half_network(models.build_model("simple_cnn"), Precision("cpu", None, "fp32 (with_amp=False)"))
    result = run_in_this_process(
        "run",
        *TINY,
        "--low_precision_weights=True",
        "--with_amp=True",
        "--amp_dtype=bfloat16",
        "--checkpoint_every=18",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=half",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "low_precision_weights: weights in bf16, 3 normalisation layers in fp32" in result.stderr
    saved = torch.load(tmp_path / "half" / "training_checkpoint_36.pt", weights_only=True)["model"]
    assert saved["0.0.weight"].dtype == torch.bfloat16 and saved["0.1.weight"].dtype == torch.float32
    evaluated = run_in_this_process(
        "evaluate",
        f"--checkpoint={tmp_path / 'half' / 'training_checkpoint_36.pt'}",
        f"--data_path={small_dataset}",
        "--json",
    )
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    trained = json.loads((tmp_path / "half" / "metrics.json").read_text())["test"]["accuracy"]
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["accuracy"] == pytest.approx(trained, abs=0.02)


def test_the_fused_optimizer_is_chosen_on_cuda_and_built_as_asked():
    assert optimizers.fused_on("auto", torch.device("cuda")) and not optimizers.fused_on("auto", CPU)
    assert optimizers.fused_on(True, CPU) and not optimizers.fused_on(False, torch.device("cuda"))
    model = models.build_model("airbench")
    for setting, fused in ((True, True), (False, None), ("auto", None)):  # auto unsettled: torch's default
        config = load_config("configs/fast.yaml", fused_optimizer=setting)
        optimizer, _ = optimizers.build_optimizer(model, config, 100)
        assert optimizer.defaults["fused"] is fused


def test_lookahead_moves_every_tensor_in_two_foreach_launches_with_the_per_tensor_numbers():
    torch.manual_seed(0)
    model = models.build_model("simple_cnn", {"width": 8})
    reference = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    look = Lookahead(model, total_iterations=100)
    look.average = {name: tensor.detach().clone() + 0.25 for name, tensor in look._averaged().items()}
    average = {name: tensor.clone() for name, tensor in look.average.items()}
    look.update(0.9)
    for name, tensor in model.state_dict().items():
        if not tensor.is_floating_point():
            continue
        expected = average[name].lerp_(reference[name], 1 - 0.9)  # what lerp_ and copy_ per tensor gave
        assert torch.equal(look.average[name], expected) and torch.equal(tensor, expected), name


def test_the_warm_up_runs_both_airbench_branches_compiled_and_leaves_the_flag_and_weights_as_they_were():
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    torch._dynamo.reset()
    network = models.build_model("airbench", {"widths": (8, 8, 8)})
    forward = torch.compile(network, backend="eager")
    optimizer = torch.optim.SGD(network.parameters(), lr=0.1, momentum=0.9)
    step = TrainStep(forward, optimizer, torch.nn.CrossEntropyLoss(), Precision("cpu", None))
    images, labels = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    before = {name: tensor.clone() for name, tensor in network.state_dict().items()}
    assert len(recipes.parts_of(network).warm_up_branches()) == 2
    for branch in recipes.parts_of(network).warm_up_branches():
        with branch:
            step(images, labels)
    assert network.whitening_bias_frozen is False
    compiled = counters["stats"]["unique_graphs"]
    network.whitening_bias_frozen = True  # what training does later: no new graph
    step(images, labels)
    network.whitening_bias_frozen = False
    step(images, labels)
    assert counters["stats"]["unique_graphs"] == compiled >= 2
    assert any(not torch.equal(before[name], tensor) for name, tensor in network.state_dict().items())
    simple = recipes.parts_of(models.build_model("simple_cnn", {"width": 8})).warm_up_branches()
    assert [branch.__class__.__name__ for branch in simple] == ["nullcontext"]


def test_the_normalisation_constants_reach_the_device_through_the_pinned_upload(monkeypatch):
    sent = []

    def spy(values, device):
        sent.append(tuple(values.shape))
        return values.to(device)

    monkeypatch.setattr(augmentation, "upload", spy)
    augmentation._normalization.cache_clear()
    try:
        inputs = augmentation.normalize(torch.full((2, 3, 4, 4), 128, dtype=torch.uint8))
    finally:
        augmentation._normalization.cache_clear()
    assert sent == [(1, 3, 1, 1), (1, 3, 1, 1)]
    assert torch.allclose(inputs[:, 0], torch.tensor((128 / 255 - MEAN[0]) / STD[0]), atol=1e-6)


def test_batched_crops_call_torchvisions_kernel_even_in_deterministic_mode(monkeypatch):
    """torchvision.ops.roi_align swaps in a compiled pure-Python version for deterministic GPU runs (compiled
    mid-training, memory-hungry in eager mode); the crops call the kernel, whose forward is deterministic."""
    import torchvision.ops

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (6, 3, 40, 40), dtype=torch.uint8, generator=generator)
    boxes = augmentation.random_resized_boxes(6, 40, 0.35, generator)
    expected = augmentation.batched_resized_crops(images, boxes, 32)

    def refuse(*args, **kwargs):
        raise AssertionError("torchvision.ops.roi_align was called")

    monkeypatch.setattr(torchvision.ops, "roi_align", refuse)
    monkeypatch.setattr(torchvision.ops.roi_align, "roi_align", refuse, raising=False)
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.equal(augmentation.batched_resized_crops(images, boxes, 32), expected)
    finally:
        torch.use_deterministic_algorithms(False)


def agree_across_two_ranks(local_rank: int, answers: str) -> None:
    import ignite.distributed as idist

    from cifar10_dist.data import run_data

    agreed = run_data.agreed(idist.get_rank() == 0)  # rank 0 would say yes, rank 1 no
    with open(f"{answers}.{idist.get_rank()}", "w") as answer:
        answer.write(str(agreed))


def test_a_choice_each_rank_makes_from_its_own_gpu_is_agreed_by_all(tmp_path):
    import ignite.distributed as idist

    # forked from this process: two new interpreters importing torch would cost it about 6 s of a core
    with idist.Parallel(backend="gloo", nproc_per_node=2, start_method="fork") as parallel:
        parallel.run(agree_across_two_ranks, str(tmp_path / "answer"))
    assert [(tmp_path / f"answer.{rank}").read_text() for rank in (0, 1)] == ["False", "False"]


def test_host_waits_are_filed_under_the_training_iteration_that_made_them(small_dataset, tmp_path):
    """tests.gpu.waits, given warnings of the text CUDA's sync debug mode gives: one from the model's forward at
    the 3rd training step, one from every evaluation forward; only iteration 3 is a training iteration's."""
    from tests.gpu.waits import HostWaits

    model = tmp_path / "warning_model.py"
    model.write_text(
        "import warnings\nfrom cifar10_dist.models.networks import simple_cnn\n"
        "calls = {'training': 0}\n\n"
        "def warn(module, inputs):\n"
        "    if module.training:\n"
        "        calls['training'] += 1\n"
        "        if calls['training'] == 3:\n"
        "            warnings.warn('called a synchronizing CUDA operation')\n"
        "    else:\n"
        "        warnings.warn('called a synchronizing CUDA operation')\n\n"
        "def model(**kwargs):\n"
        "    net = simple_cnn(**kwargs)\n"
        "    net.register_forward_pre_hook(warn)\n"
        "    return net\n"
    )
    waits = HostWaits()
    with waits.caught():
        warnings.warn("called a synchronizing CUDA operation")  # outside any run
        result = run_in_this_process(
            "run",
            *TINY,
            f"--model={model}:model",
            "--num_epochs=1",
            "--num_warmup_epochs=0.5",
            f"--data_path={small_dataset}",
            f"--output_path={tmp_path}",
            "--run_name=w",
        )
    assert result.returncode == 0, result.stderr[-2000:]
    waiting = waits.iterations_waiting({18})
    assert list(waiting) == [3] and sum(waiting[3].values()) == 1
    assert sum(waits.elsewhere["evaluation"].values()) >= 2  # the evaluations' forwards
    assert sum(waits.elsewhere["outside"].values()) >= 2  # the one above, the model's check before the run
    assert math.isclose(waits.places(waiting).most_common(1)[0][1], 1)


def test_replicas_sharing_a_gpu_are_wrapped_in_ddp_on_the_gpu_they_use():
    """Two local ranks on one GPU (gloo): rank 1 trains on cuda:0, and Ignite's auto_model would name cuda:1 as
    DDP's device (the H200 lease's 2-process check failed on it); without sharing, auto_model wraps as before."""
    assert model_setup.shares_a_gpu(torch.device("cuda", 0), local_rank=1, world_size=2)
    assert not model_setup.shares_a_gpu(torch.device("cuda", 1), local_rank=1, world_size=2)
    assert not model_setup.shares_a_gpu(torch.device("cuda", 0), local_rank=0, world_size=2)
    assert not model_setup.shares_a_gpu(CPU, local_rank=1, world_size=2)
    model = models.build_model("simple_cnn", {"width": 8})
    assert model_setup.wrapped_for_backend(model, load_config(None)) is model  # one process on a CPU: nothing to wrap


# the fast recipe whole (its schedule, the whitening bias's freeze after epoch 3, lookahead from 30% of training,
# alternating flips, reflect-padded crops, label smoothing, bf16 where the CPU runs it), at widths 16/32/32 on 512
# images, batch 64: 8 steps an epoch, 40 in all, the freeze at 24 and lookahead from 12 (the GPU issue's check that
# the 3-epoch one never reached)
FAST_SMALL = [
    "--config=fast",
    "--figures=False",
    "--dataset=synthetic",
    "--synthetic_size=512",
    "--batch_size=64",
    "--num_epochs=5",
    "--learning_rate=0.094",
    '--model_kwargs={"widths": [16, 32, 32]}',
    "--tta=0",
    "--num_workers=0",
    "--validate_every=5",
]
GPU_PLAN = ["--fused_optimizer=True", "--augment_per_pass=True"]  # what auto settles on a CUDA GPU


@pytest.mark.parametrize("plan", [[], GPU_PLAN], ids=["cpu-plan", "gpu-plan"])
def test_the_warm_up_leaves_the_whole_fast_recipe_bit_for_bit_as_it_would_have_trained(tmp_path, monkeypatch, plan):
    """warm_up_steps=3 against 0 through the bias freeze and lookahead: every tensor of the final checkpoint (model,
    optimizer, lookahead's average, schedule, trainer) equal; and the warm-up itself leaves the sampler, the
    freeze's flag, the learning rates and the random generators as it found them."""
    seen = []
    run = warm_up.WarmUp.run

    def observed(self):
        network = models.unwrap(self.step.model)
        sampler = loaders.batch_sampler_of(self.loader).sampler

        def state():
            return (
                sampler.epoch,
                sampler.start,
                sampler.order,
                network.whitening_bias_frozen,
                [group["lr"] for group in self.step.optimizer.param_groups],
                torch.get_rng_state(),
            )

        before = state()
        seconds = run(self)
        after = state()
        seen.append(before[:5] == after[:5] and torch.equal(before[5], after[5]))
        return seconds

    monkeypatch.setattr(warm_up.WarmUp, "run", observed)
    for steps in (0, 3):
        result = run_in_this_process(
            "run",
            *FAST_SMALL,
            *plan,
            f"--warm_up_steps={steps}",
            f"--output_path={tmp_path}",
            f"--run_name=warm{steps}",
        )
        assert result.returncode == 0, result.stderr[-3000:]
    assert seen == [True, True]
    assert_same_training_state(
        tmp_path / "warm0" / "training_checkpoint_40.pt", tmp_path / "warm3" / "training_checkpoint_40.pt"
    )
    warmed, plain = (
        torch.load(tmp_path / f"warm{steps}" / "training_checkpoint_40.pt", weights_only=True) for steps in (3, 0)
    )
    assert warmed[checkpoint_layout.LOOKAHEAD]["average"] is not None
    for name, tensor in plain[checkpoint_layout.LOOKAHEAD]["average"].items():
        assert torch.equal(warmed[checkpoint_layout.LOOKAHEAD]["average"][name], tensor), name

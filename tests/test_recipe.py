"""The fast recipe's parts, in process: airbench model and whitening, parameter groups and their schedules,
lookahead, test-time augmentation, crop/flip variants, and the numbers in configs/fast.yaml."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
import torch
from ignite.engine import Engine, Events
from torch import nn

from cifar10_dist import checkpoint_layout, models
from cifar10_dist.config import load_config
from cifar10_dist.data import augmentation, batches, cifar_layouts, loaders
from cifar10_dist.data.datasets import ImageSet
from cifar10_dist.models.viewing import tta_logits
from cifar10_dist.recipes.lookahead import Lookahead
from cifar10_dist.system.precision import choose_precision
from cifar10_dist.training.setup import optimizers, schedules
from tests.conftest import REPO, TINY, assert_same_training_state, run_forked, run_in_this_process


def test_fast_yaml_holds_airbench94_hyperparameters_converted_to_a_mean_loss():
    config = load_config(REPO / "configs" / "fast.yaml")
    # airbench94: lr 11.5 and weight decay 0.0153 per 1024 examples, divided by 1 + 1/(1 - momentum)
    kilostep_scale = 1024 * (1 + 1 / (1 - config.momentum))
    per_example_lr = 11.5 / kilostep_scale
    assert config.batch_size == 1024 and config.momentum == 0.85
    assert config.learning_rate == pytest.approx(per_example_lr * config.batch_size, rel=1e-3)
    decay_per_step = 0.0153 * config.batch_size / kilostep_scale
    assert config.learning_rate * config.weight_decay == pytest.approx(decay_per_step, rel=2e-3)
    assert config.num_warmup_epochs / config.num_epochs == pytest.approx(0.23)  # the triangle's peak
    assert (config.lr_start, config.lr_end, config.bias_lr_scale, config.label_smoothing) == (0.2, 0.07, 64, 0.2)


def test_whitening_makes_training_patches_uncorrelated_with_unit_variance():
    torch.manual_seed(0)
    mixing = torch.tensor([[1.0, 0.8, 0.2], [0.0, 1.0, 0.5], [0.0, 0.0, 0.3]])
    images = torch.einsum("ij,njhw->nihw", mixing, torch.randn(200, 3, 32, 32))
    images = images + torch.roll(images, 1, dims=-1)  # neighbouring pixels correlated too
    model = models.AirbenchNet()
    model.init_whitening(images)
    with torch.no_grad():
        features = model.whiten(images) - model.whiten.bias.view(1, -1, 1, 1)
    half = features[:, :12].permute(0, 2, 3, 1).reshape(-1, 12).double()
    covariance = torch.cov(half.T)
    assert torch.allclose(covariance, torch.eye(12, dtype=torch.double), atol=0.02)
    assert torch.equal(model.whiten.weight[12:], -model.whiten.weight[:12])
    assert not model.whiten.weight.requires_grad


def test_the_airbench_network_is_asked_for_its_whitening_as_nn_module_serves_its_submodules():
    """From Python 3.12 on, isinstance against a protocol reads attributes statically and misses a module's
    submodules: fast.yaml then trained without its whitening from data and lost a point on an H200
    (docs/gpu-report.md, the bisect). The trait is asked with is_whitened_from_data on every Python."""
    from cifar10_dist import recipes
    from cifar10_dist.recipes.whitened import Whitening

    network = models.build_model("airbench")
    assert inspect.getattr_static(network, "whiten", None) is None  # what Python 3.12's isinstance reads
    assert models.is_whitened_from_data(network)
    assert models.whitening_bias(network) is network.whiten.bias
    assert isinstance(recipes.parts_of(network), Whitening)
    with pytest.raises(TypeError):  # the protocol is not runtime-checkable: isinstance cannot come back
        isinstance(network, models.WhitenedFromData)
    resnet = models.build_model("simple_cnn")
    assert not models.is_whitened_from_data(resnet) and models.whitening_bias(resnet) is None
    assert not isinstance(recipes.parts_of(resnet), Whitening)


@pytest.mark.parametrize("side", [32, 24, 16])
def test_the_airbench_networks_global_max_pool_is_adaptive_max_poolings_result_without_its_kernel(side):
    """The last pooling is max_pool2d over the whole map: CUDA's adaptive_max_pool2d copies a channels-last input
    to contiguous first (200 us a call on an H200, docs/gpu-report.md). The same maxima and input gradients as
    AdaptiveMaxPool2d(1), bit for bit, in bf16 with ties, at the map sizes of 32, 24 and 16 px images; and the
    network's training step dispatches no adaptive_max_pool2d."""
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.manual_seed(0)
    maps = (torch.randn(64, 256, side // 8 - 1, side // 8 - 1) * 2).round() / 2  # many ties
    maps = maps.to(torch.bfloat16).contiguous(memory_format=torch.channels_last).requires_grad_()
    ours, theirs = models.networks.GlobalMaxPool()(maps), nn.AdaptiveMaxPool2d(1)(maps)
    assert torch.equal(ours, theirs) and ours.shape == (64, 256, 1, 1)
    pull = torch.randn_like(ours)
    assert torch.equal(torch.autograd.grad(ours, maps, pull)[0], torch.autograd.grad(theirs, maps, pull)[0])

    class Operators(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    network = models.build_model("airbench").to(memory_format=torch.channels_last)
    images = torch.randn(4, 3, side, side).contiguous(memory_format=torch.channels_last)
    with Operators() as operators:
        network(images).sum().backward()
    assert "aten.max_pool2d_with_indices" in operators.seen
    assert not {name for name in operators.seen if "adaptive" in name}, operators.seen


def test_a_compiled_airbench_network_compiles_evaluation_once_before_and_after_its_bias_froze():
    """torch.compile guards a graph on what its forward read: evaluation read the whitening bias's flag and was
    compiled again after the freeze, and the test-time views shifted by a pixel (slices of a padded batch, other
    strides) each got a graph of their own. Now the test-time views are dense in the batch's layout, evaluation
    never reads the flag: three graphs in all (training before and after the freeze, evaluation), not five, and
    the same logits as the model uncompiled."""
    from cifar10_dist.models.viewing import tta_logits

    graphs = []

    def counting(graph: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(graph)
        return graph.forward

    torch.manual_seed(0)
    network = models.build_model("airbench", {"widths": (8, 16, 16)}).to(memory_format=torch.channels_last)
    compiled = torch.compile(network, backend=counting)
    images = torch.randn(4, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    try:
        for frozen in (False, True):
            network.whitening_bias_frozen = frozen
            network.train()
            compiled(images).sum().backward()
            network.eval()
            with torch.no_grad():
                assert torch.equal(tta_logits(compiled, images, 2), tta_logits(network, images, 2))
    finally:
        torch._dynamo.reset()
    assert len(graphs) == 3


def test_a_compiled_model_with_its_parallel_wrapper_inside_is_unwrapped_to_the_network():
    """torch.compile(DDP(model)) is what a compiled run of several processes steps: its warm-up asks the recipe's
    parts of it, so that the whitening bias's frozen branch is compiled before the timed steps too. DataParallel
    stands in for DDP here (no process group). The wrapper is torch.compile's own class, built without its
    backend's seconds of set-up; nothing compiles."""
    from torch._dynamo.eval_frame import DisableContext, OptimizedModule

    from cifar10_dist import recipes
    from cifar10_dist.recipes.whitened import Whitening

    def compiled(model: nn.Module) -> nn.Module:
        return OptimizedModule(model, DisableContext())  # what torch.compile(model) returns, uncompiled

    network = models.build_model("airbench")
    for wrapped in (compiled(nn.DataParallel(network)), nn.DataParallel(compiled(network))):
        assert models.unwrap(wrapped) is network
        parts = recipes.parts_of(wrapped)
        assert isinstance(parts, Whitening) and parts.network is network and parts.bias_trains


def test_airbench_takes_silu_for_gelu_and_refuses_other_activations_before_launch():
    from cifar10_dist.errors import UserError

    silu = models.build_model("airbench", {"activation": "silu"})
    kinds = {type(m).__name__ for m in silu.modules() if isinstance(m, (nn.GELU, nn.SiLU))}
    assert kinds == {"SiLU"} and sum(isinstance(m, nn.SiLU) for m in silu.modules()) == 7
    models.check_model("airbench", {"activation": "silu"})
    with pytest.raises(UserError, match=r"^model=airbench activation='relu' is not one of gelu, silu$"):
        models.check_model("airbench", {"activation": "relu"})


def test_airbench_convolutions_start_as_identity_and_norm_scales_are_frozen():
    model = models.build_model("airbench")
    first = model.layers[1][0]  # first conv of the first group: 24 -> 64 channels
    expected = torch.zeros(24, 24, 3, 3)
    nn.init.dirac_(expected)
    assert torch.equal(first.weight[:24], expected)
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(norms) == 6 and all(not m.weight.requires_grad and m.bias.requires_grad for m in norms)
    assert all(m.momentum == pytest.approx(0.4) for m in norms)
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 10)


def lrs_during(optimizer: torch.optim.Optimizer, scheduler, iterations: int) -> list[list[float]]:
    """The lr of every param group at each iteration of an Engine driven by the scheduler."""
    seen = []
    engine = Engine(lambda engine, batch: None)
    engine.add_event_handler(Events.ITERATION_STARTED, scheduler)
    engine.add_event_handler(Events.ITERATION_STARTED, lambda _: seen.append([g["lr"] for g in optimizer.param_groups]))
    engine.run([0] * iterations, max_epochs=1)
    return seen


def test_parameter_groups_scale_norm_biases_and_freeze_the_whitening_bias_part_way():
    config = dataclasses.replace(load_config(REPO / "configs" / "fast.yaml"), learning_rate=1.0)
    model = models.build_model("airbench")
    groups = optimizers.parameter_groups(model, config, total_iterations=100)
    others, norm_biases, whitening = groups
    assert [p is model.whiten.bias for p in whitening.params] == [True]
    assert whitening.schedule == schedules.GroupSchedule(lr_scale=1.0, train_until=30)
    assert len(norm_biases.params) == 6 and norm_biases.lr == 64.0 and norm_biases.schedule.lr_scale == 64
    assert norm_biases.weight_decay * norm_biases.lr == pytest.approx(others.weight_decay * others.lr)
    trained = {id(p) for g in groups for p in g.params}
    assert id(model.whiten.weight) not in trained  # frozen filters are not optimised
    assert len(trained) == sum(p.requires_grad for p in model.parameters())

    optimizer = torch.optim.SGD([group.for_optimizer() for group in groups], lr=1.0, momentum=0.85, nesterov=True)
    scheduler = schedules.create_lr_scheduler(
        optimizer,
        1.0,
        warmup_iterations=23,
        total_iterations=100,
        start=0.2,
        end=0.07,
        group_schedules=[g.schedule for g in groups],
    )
    lrs = lrs_during(optimizer, scheduler, 100)
    assert lrs[0] == pytest.approx([0.2, 12.8, 0.2])
    assert lrs[23] == pytest.approx([1.0, 64.0, 1.0])  # peak (iteration 24 is index 23)
    assert lrs[30][2] > 0 and lrs[31][2] == 0 and lrs[99][2] == 0  # whitening bias: trained until 30
    assert lrs[99][:2] == pytest.approx([0.07 + 0.93 * 1 / 77, 64 * (0.07 + 0.93 * 1 / 77)])


def test_the_whitening_bias_trains_for_its_epochs_and_can_decay_to_zero_over_them_as_the_muon_record_does():
    """airbench94_muon: the whitening bias's lr falls linearly from its peak to 0 over 3 epochs while the rest
    follow the main schedule; here 8 epochs of 25 iterations, so 75 iterations."""
    config = dataclasses.replace(
        load_config(REPO / "configs" / "fast_muon.yaml"),
        muon_lr=None,
        learning_rate=2.0,
        whitening_bias_lr_scale=4.0,
        whitening_bias_epochs=3.0,
        whitening_bias_decay=True,
    )
    model = models.build_model("airbench")
    groups = optimizers.parameter_groups(model, config, total_iterations=200)
    assert groups[2].schedule == schedules.GroupSchedule(lr_scale=4.0, train_until=75, decay_to_until=True)
    optimizer = torch.optim.SGD([group.for_optimizer() for group in groups], lr=2.0)
    scheduler = schedules.create_lr_scheduler(
        optimizer, 2.0, 0, 200, start=1.0, end=0.0, group_schedules=[g.schedule for g in groups]
    )
    lrs = lrs_during(optimizer, scheduler, 200)
    whitening = [lr[2] for lr in lrs]
    assert whitening[0] == pytest.approx(8.0) and whitening[30] == pytest.approx(8.0 * (1 - 30 / 75))
    assert whitening[75:] == [0.0] * 125
    assert lrs[100][:2] == pytest.approx([1.0, 64.0])  # the others follow the main schedule, halfway down

    two_epochs = dataclasses.replace(config, whitening_bias_epochs=2.0, whitening_bias_decay=False)
    assert optimizers.parameter_groups(model, two_epochs, total_iterations=200)[2].schedule == schedules.GroupSchedule(
        lr_scale=4.0, train_until=50
    )


def _train_airbench(freeze: bool, decay: bool, iterations: int = 10) -> tuple[nn.Module, list[bool], list[bool]]:
    """A small airbench network trained ``iterations`` steps with fast_muon.yaml's optimizer and schedules (the
    whitening bias trains for 3 iterations), with or without its recipe's freeze (``recipes.whitened``). Returns the
    network, its ``whitening_bias_frozen`` at each step, and whether the first conv group's input needed a gradient.
    """
    from cifar10_dist import recipes

    config = dataclasses.replace(
        load_config(REPO / "configs" / "fast_muon.yaml"),
        num_epochs=iterations,
        whitening_bias_epochs=3.0,
        whitening_bias_decay=decay,
    )
    torch.manual_seed(0)
    model = models.AirbenchNet(widths=(8, 16, 16))
    images, labels = torch.randn(iterations, 16, 3, 32, 32), torch.randint(0, 10, (iterations, 16))
    optimizer, group_schedules = optimizers.build_optimizer(model, config, iterations)
    scheduler = schedules.create_lr_scheduler(
        optimizer, config.learning_rate, 0, iterations, start=1.0, group_schedules=group_schedules
    )
    frozen, input_needed_grad = [], []
    model.layers[1].register_forward_pre_hook(lambda _, inputs: input_needed_grad.append(inputs[0].requires_grad))

    def step(engine: Engine, index: int) -> None:
        if index == 2:
            optimizer.load_state_dict(optimizer.state_dict())  # as a resume does: new param group dicts
        frozen.append(model.whitening_bias_frozen)
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(images[index]), labels[index]).backward()
        optimizer.step()

    trainer = Engine(step)
    trainer.add_event_handler(Events.ITERATION_STARTED, scheduler)
    if freeze:  # the recipe's part, as the run attaches it
        recipes.parts_of(model).attach(trainer, optimizer, config, iterations)
    trainer.run(range(iterations), max_epochs=1)
    return model, frozen, input_needed_grad


@pytest.mark.parametrize("decay", [False, True], ids=["frozen", "decayed-to-zero"])
def test_once_the_whitening_bias_is_frozen_its_gradient_is_skipped_and_every_weight_moves_as_before(decay):
    """airbench's own code detaches the bias after its epochs: the backward pass then stops at the first conv
    group's filters. The frozen steps start where the bias's lr is 0 (after iteration 3 if it was trained at a
    flat scale, or at iteration 4 when it decays to 0 at 3: the scheduler counts from 0), and the weights end bit
    for bit as when the gradient is still computed and the lr of 0 leaves the bias where it is."""
    plain, never, needed_without = _train_airbench(freeze=False, decay=decay)
    skipping, frozen, needed_with = _train_airbench(freeze=True, decay=decay)
    first_frozen = 4 if decay else 5
    assert frozen == [False] * (first_frozen - 1) + [True] * (11 - first_frozen) and not any(never)
    assert needed_with == [not f for f in frozen] and all(needed_without)
    for (name, mine), theirs in zip(skipping.state_dict().items(), plain.state_dict().values()):
        assert torch.equal(mine, theirs), name
    with torch.no_grad():
        assert torch.equal(skipping(torch.ones(2, 3, 32, 32)), plain(torch.ones(2, 3, 32, 32)))


def test_a_single_group_keeps_the_plain_schedule():
    model = models.build_model("simple_cnn")
    config = load_config()
    groups = optimizers.parameter_groups(model, config, total_iterations=10)
    assert len(groups) == 1 and groups[0].schedule == schedules.GroupSchedule()
    optimizer = torch.optim.SGD([group.for_optimizer() for group in groups], lr=0.4)
    scheduler = schedules.create_lr_scheduler(optimizer, 0.4, 2, 10, group_schedules=[g.schedule for g in groups])
    assert isinstance(scheduler, schedules.PiecewiseLinear)  # checkpoints stay as before
    lrs = [lrs[0] for lrs in lrs_during(optimizer, scheduler, 10)]
    assert lrs == pytest.approx([0, 0.2, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1, 0.05])


def test_lookahead_pulls_weights_to_their_average_and_restores_from_its_state():
    model = nn.Linear(2, 1, bias=False)
    nn.init.zeros_(model.weight)
    lookahead = Lookahead(model, total_iterations=20, start_fraction=0.5, every=5, decay=0.9, power=1.0)
    trajectory = []

    def step(engine, batch):
        with torch.no_grad():
            model.weight.add_(1.0)  # a stand-in for an optimizer step
        trajectory.append(model.weight.clone())

    engine = Engine(step)
    lookahead.attach(engine)
    engine.run([0] * 20, max_epochs=1)
    # 1..9: plain steps; 10: the average starts as the weights (10); 15: it moves towards the weights (15)
    # with decay 0.9**5 * 15/20 and the weights jump to it; 20: the same with decay 0.9**5 * 20/20
    assert torch.equal(trajectory[8], torch.full((1, 2), 9.0))
    after_15 = 10 + (1 - 0.9**5 * 15 / 20) * 5
    assert torch.allclose(trajectory[15], torch.full((1, 2), after_15 + 1))  # iteration 16 stepped from it
    after_20 = after_15 + (1 - 0.9**5) * 5
    assert torch.allclose(model.weight, torch.full((1, 2), after_20))
    assert torch.equal(lookahead.average["weight"], model.weight)
    restored = Lookahead(model, total_iterations=20)
    restored.load_state_dict(lookahead.state_dict())
    assert torch.equal(restored.average["weight"], lookahead.average["weight"])


class Recorder(nn.Module):
    """Returns the top-left pixel of channel 0 and of the mirrored corner as logits; records every view."""

    def __init__(self) -> None:
        super().__init__()
        self.views: list[torch.Tensor] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.views.append(images)
        return torch.stack([images[:, 0, 0, 0], images[:, 0, 0, -1]], dim=1)


def test_test_time_augmentation_averages_mirrors_and_one_pixel_shifts():
    images = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    model = Recorder()
    assert torch.equal(tta_logits(model, images, 0), model(images)) and len(model.views) == 2
    model.views.clear()
    mirrored = tta_logits(model, images, 1)
    assert len(model.views) == 2
    assert torch.allclose(mirrored, 0.5 * model(images) + 0.5 * model(images.flip(-1)))
    model.views.clear()
    logits = tta_logits(model, images, 2)
    assert len(model.views) == 6
    padded = nn.functional.pad(images, (1, 1, 1, 1), mode="reflect")
    up_left, down_right = padded[..., :4, :4], padded[..., 2:, 2:]
    assert torch.equal(model.views[2], up_left) and torch.equal(model.views[4], down_right)

    def both(view):
        return 0.5 * Recorder()(view) + 0.5 * Recorder()(view.flip(-1))

    assert torch.allclose(logits, 0.5 * both(images) + 0.25 * both(up_left) + 0.25 * both(down_right))


def test_reflect_crops_are_windows_of_the_reflect_padded_image():
    images = torch.randint(0, 256, (32, 3, 32, 32), dtype=torch.uint8)
    out = augmentation.augment(images, torch.Generator().manual_seed(3), padding=2, pad_mode="reflect", flip="none")
    padded = nn.functional.pad(images, (2, 2, 2, 2), mode="reflect")
    offsets = set()
    for index in range(32):
        matches = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(out[index], padded[index, :, dy : dy + 32, dx : dx + 32])
        ]
        assert matches, index
        offsets.update(matches)
    assert len(offsets) > 5  # the shift varies from image to image


def test_flip_all_and_none_and_pre_flip():
    images = torch.randint(0, 256, (200, 3, 32, 32), dtype=torch.uint8)
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(augmentation.augment(images, generator, padding=0, flip="none"), images)
    assert torch.equal(augmentation.augment(images, generator, padding=0, flip="all"), images.flip(-1))
    labels = torch.zeros(200, dtype=torch.long)
    first = loaders.pre_flip(ImageSet(images, labels), seed=7).images
    assert torch.equal(first, loaders.pre_flip(ImageSet(images, labels), seed=7).images)
    flipped = [torch.equal(first[i], images[i].flip(-1)) for i in range(200)]
    kept = [torch.equal(first[i], images[i]) for i in range(200)]
    assert all(f or k for f, k in zip(flipped, kept)) and 70 < sum(flipped) < 130


def test_alternating_flip_mirrors_every_image_in_every_second_epoch():
    config = load_config(flip="alternating", crop_padding=0, channels_last=True)
    prepare = batches.train_batch_preparer(
        torch.device("cpu"), batches.TrainAugmentation.of(config), 3, cifar_layouts.cifar_info("cifar10")
    )
    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    labels = torch.arange(8)
    epoch_1 = [prepare((images, labels), iteration)[0] for iteration in (1, 3)]
    epoch_2 = [prepare((images, labels), iteration)[0] for iteration in (4, 6)]
    epoch_3, _ = prepare((images, labels), 7)
    plain = augmentation.normalize(images)
    assert all(torch.equal(x, plain) for x in epoch_1) and torch.equal(epoch_3, plain)
    assert all(torch.equal(x, plain.flip(-1)) for x in epoch_2)
    assert epoch_3.is_contiguous(memory_format=torch.channels_last)


def test_amp_on_cpu_means_bf16_autocast():
    precision = choose_precision(torch.device("cpu"), with_amp=True)
    assert precision.dtype == torch.bfloat16 and not precision.needs_grad_scaler
    with precision.autocast():
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    assert choose_precision(torch.device("cpu"), with_amp=False).dtype is None
    assert choose_precision(torch.device("cuda"), with_amp=True).needs_grad_scaler  # fp16 on CUDA
    assert not choose_precision(torch.device("cuda"), True, "bfloat16").needs_grad_scaler


def test_amp_dtype_float16_trains_with_a_checkpointed_grad_scaler(tmp_path):
    # fp16 autocast on the CPU is slow (no fast kernels): 3 iterations
    result = run_in_this_process(
        "run",
        *TINY,
        *SMALL,
        "--num_epochs=1",
        "--num_warmup_epochs=0.5",
        "--epoch_length=3",
        "--checkpoint_every=3",
        "--train_eval_size=0",
        "--with_amp=True",
        "--amp_dtype=float16",
        f"--output_path={tmp_path}",
        "--run_name=fp16",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    checkpoint = torch.load(tmp_path / "fp16" / "training_checkpoint_3.pt", weights_only=True)
    assert checkpoint["scaler"]["scale"] > 0
    bad = run_in_this_process("run", *TINY, *SMALL, "--amp_dtype=fp8", f"--output_path={tmp_path}")
    assert bad.returncode == 2
    assert bad.stderr == "error: amp_dtype='fp8' is unknown: choose one of auto, float16, bfloat16\n"


# ---------------------------------------------------------------- whole runs through the CLI

# In-memory synthetic data sized so that every batch is full (one compiled shape per engine):
# 640 training images, 128 test images, a train subset of 64
SMALL = ["--dataset=synthetic", "--synthetic_size=640", "--train_eval_size=64", "--figures=False"]
# configs/fast.yaml scaled down: the airbench network at widths 16/32/32 (a quarter and an eighth of its own),
# batch 64 (lr scaled with it), 10 iterations per epoch, 30 in all; lookahead from iteration 9, whitening bias
# trained until 9, checkpoints at 12, 24 and 30 (the last 2 kept)
FAST_TINY = [
    "--config=" + str(REPO / "configs" / "fast.yaml"),
    *SMALL,
    '--model_kwargs={"widths": [16, 32, 32]}',
    "--batch_size=64",
    "--learning_rate=0.1",
    "--num_epochs=3",
    "--num_warmup_epochs=0.69",
    "--validate_every=3",
    "--checkpoint_every=12",
    "--log_every_iters=5",
]


@pytest.mark.slow  # two processes, a resume
def test_fast_recipe_with_two_processes_resumes_to_the_identical_state(tmp_path):
    """Lookahead, per-group schedules, alternating flip, bf16, channels_last and data_on_device, 2 gloo processes:
    resumed at iteration 24 (mid-epoch 3, between lookahead steps), every tensor ends as in the uninterrupted run."""
    launch = ["--backend=gloo", "--nproc_per_node=2", f"--output_path={tmp_path}"]
    reference = run_in_this_process("run", *FAST_TINY, *launch, "--run_name=ref")
    assert reference.returncode == 0, reference.stderr[-3000:]
    metrics = json.loads((tmp_path / "ref" / "metrics.json").read_text())
    assert metrics["iterations"] == 30 and metrics["test"]["num_samples"] == 128
    print("fast recipe accuracy", metrics["test"]["accuracy"])
    assert metrics["test"]["accuracy"] > 0.3  # chance is 0.1
    resumed = run_in_this_process(
        "run",
        *FAST_TINY,
        *launch,
        "--run_name=resumed",
        f"--resume_from={tmp_path / 'ref' / 'training_checkpoint_24.pt'}",
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final_a, final_b = (tmp_path / name / "training_checkpoint_30.pt" for name in ("ref", "resumed"))
    assert_same_training_state(final_a, final_b)
    averages = [
        torch.load(path, weights_only=True)[checkpoint_layout.LOOKAHEAD]["average"] for path in (final_a, final_b)
    ]
    assert averages[0].keys() == averages[1].keys() and len(averages[0]) > 10
    assert all(torch.equal(averages[0][key], averages[1][key]) for key in averages[0])
    assert json.loads((tmp_path / "resumed" / "metrics.json").read_text())["test"] == metrics["test"]


def test_data_on_device_trains_exactly_as_the_loader_does(tmp_path):
    common = ["run", *TINY, *SMALL, "--num_epochs=1", "--num_warmup_epochs=0.5", f"--output_path={tmp_path}"]
    for name, flag in (("loader", "False"), ("device", "True")):
        result = run_in_this_process(
            *common, f"--run_name={name}", f"--data_on_device={flag}", "--checkpoint_every=100"
        )
        assert result.returncode == 0, result.stderr[-3000:]
    weights = [
        torch.load(tmp_path / name / "training_checkpoint_20.pt", weights_only=True)["model"]
        for name in ("loader", "device")
    ]
    assert all(torch.equal(weights[0][key], weights[1][key]) for key in weights[0])


@pytest.mark.slow
def test_compiled_autocast_channels_last_run_saves_plain_checkpoints_that_evaluate_alike(tmp_path):
    """compile + with_amp=auto (bf16 autocast on a CPU with native bf16; fp32 elsewhere, so that no machine pays for
    emulated bf16) + channels_last + tta=1 in one run of a user's model (a file reference); `evaluate` (eager,
    inheriting the model and tta from the checkpoint) reproduces its test accuracy, and checkpoints carry the plain
    module's keys. The model is one conv-BN-ReLU stage and a head: inductor compiles each of its kernels with a C++
    compiler, about 0.7 s of a core each, into a cache that starts empty on a new machine (half the kernels of
    simple_cnn's three stages: about 12 s of a core less there)."""
    (tmp_path / "user_model.py").write_text(
        "from torch import nn\n\n\ndef net(width):\n    return nn.Sequential(\n"
        "        nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),\n"
        "        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10)\n    )\n"
    )
    result = run_forked(
        "run",
        *TINY,
        *SMALL,
        "--compile=True",
        "--with_amp=auto",
        "--channels_last=True",
        "--tta=1",
        f"--model={tmp_path / 'user_model.py'}:net",
        '--model_kwargs={"width": 16}',
        f"--output_path={tmp_path}",
        "--run_name=fast",
    )  # (compiled without a pool of compiling processes: TORCHINDUCTOR_COMPILE_THREADS=1, tests/conftest.py)
    assert result.returncode == 0, result.stderr[-3000:]
    final = json.loads((tmp_path / "fast" / "metrics.json").read_text())["test"]
    checkpoint = tmp_path / "fast" / "training_checkpoint_40.pt"
    model_keys = list(torch.load(checkpoint, weights_only=True)["model"])
    assert model_keys == [  # no "_orig_mod." prefix
        "0.weight",
        "1.weight",
        "1.bias",
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
        "5.weight",
        "5.bias",
    ]
    same = run_in_this_process(
        "evaluate", f"--checkpoint={checkpoint}", "--json", "--num_workers=0", "--with_amp=auto", "--channels_last=True"
    )  # dataset, synthetic_size and tta=1 come from the checkpoint
    assert same.returncode == 0, same.stderr[-3000:]
    assert abs(json.loads(same.stdout.strip().splitlines()[-1])["accuracy"] - final["accuracy"]) <= 1 / 128


def test_the_benchmark_steps_measure_the_bare_loop_and_our_trainer_on_a_small_model():
    """Keeps benchmarks.steps (the loops every benchmark measures, run by hand) working as the code under it
    changes."""
    from benchmarks import steps

    batch = (torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,)))
    timed = steps.bare_loop("simple_cnn", batch, steps=3, warmup=1, channels_last=True, amp=True)
    assert timed.steps == 3 and timed.images_per_second == pytest.approx(3 * 8 / timed.seconds)
    assert len(set(timed.losses)) == 3  # each timed step really trained (the loss moves)
    timed = steps.engine_loop("simple_cnn", batch, steps=3, warmup=1)
    assert timed.steps == 3 and timed.images_per_second == pytest.approx(3 * 8 / timed.seconds)
    assert timed.recorded == 2  # the run's handlers were attached: warm-up and timed run each wrote an epoch line
    assert steps.flops_per_image("airbench") == pytest.approx(0.708e9, rel=0.02)


@pytest.mark.slow
def test_the_benchmark_runner_trains_through_the_api_in_a_fresh_process_and_reads_the_run_back(tmp_path, small_dataset):
    """benchmarks.runner: one real run (api.train in its own process), read back through reports (no log)."""
    from benchmarks import runner

    run = runner.train_ours(
        tmp_path,
        None,
        "cpu",
        model="simple_cnn",
        batch_size=32,
        num_workers=0,
        num_epochs=2,
        num_warmup_epochs=1,
        train_eval_size=100,
        data_path=str(small_dataset),
    )
    assert run.run_dir == tmp_path / "bench" and run.summary.epochs == 2 and len(run.epochs) == 2
    assert 0 <= run.accuracy <= 1 and run.accuracy == run.summary.final["test"].accuracy
    assert run.evaluation_seconds("test") > 0 and run.wall_seconds > run.summary.total_time > 0
    assert run.peak_rss_mib > 100  # torch alone takes more
    assert [point[1] for point in run.curve("test")] == [
        row["accuracy"] for row in run.evaluations if row["split"] == "test"
    ]

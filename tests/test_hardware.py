"""Fast on the machine you have: precision chosen by what the CPU (or GPU) runs fast, ``doctor``, and a training
loop that never waits for the device between the iterations that log.

The CPU's capabilities are faked (``hardware.cpu_info``) so that both decisions are tested on any machine; no
test here computes in bf16, so an AVX2-only CPU runs them as fast as any.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks import suite
from cifar10_dist import api
from cifar10_dist.config import load_config
from cifar10_dist.errors import UserError
from cifar10_dist.system import doctor, hardware, layout_numerics
from cifar10_dist.system.precision import automatic_precision, choose_precision
from tests.conftest import REPO, TINY, run_in_this_process
from tests.test_recipe import FAST_TINY

AVX2_ONLY = hardware.CpuInfo(
    "Fake EPYC 7B12", "AVX2", amx_bf16=False, avx512_bf16=False, logical_cores=2, torch_threads=2
)
AMX = hardware.CpuInfo("Fake Xeon 8488C", "AVX512", amx_bf16=True, avx512_bf16=True, logical_cores=2, torch_threads=2)
ZEN4 = hardware.CpuInfo("Fake EPYC 9R14", "AVX512", amx_bf16=False, avx512_bf16=True, logical_cores=2, torch_threads=2)


def fake_cpu(monkeypatch: pytest.MonkeyPatch, info: hardware.CpuInfo) -> None:
    monkeypatch.setattr(hardware, "cpu_info", lambda: info)


@pytest.mark.parametrize(
    "info, dtype, words",
    [
        (
            AVX2_ONLY,
            None,
            "fp32 (with_amp=auto: Fake EPYC 7B12, AVX2, no native bf16; bf16 autocast would be emulated "
            "here, many times slower)",
        ),
        (AMX, torch.bfloat16, "bf16 autocast (with_amp=auto: Fake Xeon 8488C, AVX512, native bf16 (AMX, AVX512-BF16))"),
        (ZEN4, torch.bfloat16, "bf16 autocast (with_amp=auto: Fake EPYC 9R14, AVX512, native bf16 (AVX512-BF16))"),
    ],
)
def test_auto_precision_on_a_cpu_is_bf16_only_with_native_bf16_kernels(monkeypatch, info, dtype, words):
    fake_cpu(monkeypatch, info)
    precision = choose_precision(torch.device("cpu"), "auto")
    assert precision.dtype == dtype and precision.warning is None
    assert precision.reason.startswith(words)
    assert not precision.needs_grad_scaler


def test_explicit_amp_on_a_cpu_without_native_bf16_trains_bf16_but_warns(monkeypatch):
    fake_cpu(monkeypatch, AVX2_ONLY)
    precision = choose_precision(torch.device("cpu"), True)
    assert precision.dtype == torch.bfloat16 and precision.reason == "bf16 autocast (with_amp=True)"
    assert precision.warning.startswith(
        "with_amp=True on a CPU without native bf16 (Fake EPYC 7B12, AVX2, no native "
        "bf16): bf16 autocast is emulated here, typically 5-15x slower than fp32"
    )
    assert precision.warning.endswith("--with_amp=auto trains in fp32 on this CPU")
    fake_cpu(monkeypatch, AMX)
    assert choose_precision(torch.device("cpu"), True).warning is None
    assert choose_precision(torch.device("cpu"), False).reason == "fp32 (with_amp=False)"


def test_with_amp_takes_true_false_or_auto_and_auto_chooses_the_type_itself():
    assert [load_config(with_amp=value).with_amp for value in ("auto", "AUTO", "true", True, False)] == [
        "auto",
        "auto",
        True,
        True,
        False,
    ]
    with pytest.raises(UserError, match=r"^with_amp='fast' has the wrong type: expected bool or auto$"):
        load_config(with_amp="fast")
    with pytest.raises(UserError, match="^amp_dtype=float16 with with_amp=auto: auto chooses the type itself"):
        load_config(with_amp="auto", amp_dtype="float16")
    assert load_config("configs/fast.yaml").with_amp == "auto"
    assert load_config("configs/fast_muon.yaml").with_amp == "auto"


def test_the_fast_recipe_trains_in_fp32_on_a_cpu_without_native_bf16_and_records_why(monkeypatch, tmp_path):
    fake_cpu(monkeypatch, AVX2_ONLY)
    result = run_in_this_process(
        "run",
        *FAST_TINY,
        "--num_epochs=1",
        "--num_warmup_epochs=0.5",
        "--validate_every=1",
        "--tta=0",
        f"--output_path={tmp_path}",
        "--run_name=avx2",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(
        r"INFO precision: fp32 \(with_amp=auto: Fake EPYC 7B12, AVX2, no native bf16; bf16 autocast "
        r"would be emulated here, many times slower\)\n",
        result.stderr,
    ), result.stderr[-3000:]
    summary = json.loads((tmp_path / "avx2" / "summary.json").read_text())
    provenance = json.loads((tmp_path / "avx2" / "provenance.json").read_text())
    assert summary["precision"] == provenance["precision"] == "fp32"
    assert (
        summary["hardware"]["cpu"]
        == provenance["hardware"]["cpu"]
        == {
            "model": "Fake EPYC 7B12",
            "capability": "AVX2",
            "amx_bf16": False,
            "avx512_bf16": False,
            "logical_cores": 2,
            "torch_threads": 2,
            "family": "",
            "native_bf16": False,
        }
    )


def test_doctor_reports_the_machine_its_probe_and_the_auto_choice(monkeypatch):
    fake_cpu(monkeypatch, AVX2_ONLY)
    # 1 s a setting: enough for 3 fp32 steps after a first step that pays the process's lazy set-up (0.5 s seen
    # on a busy AVX2 EPYC)
    result = run_in_this_process("doctor", "--model=simple_cnn", "--batch_size=8", "--budget_seconds=1", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["versions"]["torch"] == torch.__version__ and report["cpu"]["model"] == "Fake EPYC 7B12"
    assert report["device"] == "cpu" and report["gpus"] == [] and report["backends"]["gloo"] is True
    assert report["auto_precision"].startswith("fp32 (with_amp=auto: Fake EPYC 7B12, AVX2, no native bf16;")
    assert [probe["setting"] for probe in report["probes"]] == [
        "fp32",
        "fp32 + channels_last",
        "bf16 autocast + channels_last",
    ]
    fp32, layout, bf16 = report["probes"]
    assert fp32["images_per_second"] > 0 and layout["images_per_second"] > 0
    # bf16 is really emulated on an AVX2-only CPU (not only faked): it may be too slow to time in its budget there
    assert bf16["images_per_second"] > 0 or bf16["verdict"].startswith("not measurable here: ")
    assert report["probes"][0]["relative_to_fp32"] == 1.0
    assert report["advice"][0].startswith(
        "with_amp=auto picks fp32 here; against fp32 in this probe: fp32 + channels_last "
    )
    assert re.fullmatch(
        r"fp32 error against float64 \S+ channels-last, \S+ contiguous \(\d+\.\dx, 6 layers\): "
        r"within fp32 noise",
        report["layout_numerics"],
    )
    assert report["advice"][-1] == (
        "1 process runs well here: it trains on all 2 cores; --nproc_per_node=N shares them among N processes, no "
        "faster (use it to rehearse a distributed run, or one process per node)"
    )
    text = run_in_this_process("doctor", "--model=simple_cnn", "--batch_size=8", "--budget_seconds=0.2")
    assert "\ncpu: Fake EPYC 7B12, 2 cores usable, 2 torch threads, kernels AVX2, native bf16: no\n" in text.stdout
    assert "\nwith_amp=auto on cpu: fp32 (with_amp=auto: Fake EPYC 7B12, AVX2" in text.stdout
    bad = run_in_this_process("doctor", "--model=no_such_net")
    assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "no_such_net" in bad.stderr


@pytest.mark.parametrize(
    "processes, threads, cores, said",
    [
        (1, 2, 2, None),
        (
            2,
            1,
            2,
            "2 processes share this machine's 2 cores (1 thread each): one process already trains on every "
            "core, so expect no speed-up, often a slowdown; several CPU processes rehearse a distributed run, or use "
            "several nodes",
        ),
        (
            2,
            2,
            2,
            "2 processes x 2 CPU threads on this machine's 2 cores: more threads than cores, so they wait on "
            "each other; expect a slower run than one process (OMP_NUM_THREADS=1 fits them)",
        ),
    ],
)
def test_several_cpu_processes_of_one_machine_are_told_what_to_expect(processes, threads, cores, said):
    from cifar10_dist.system import cpu

    assert cpu.several_processes_here(processes, threads, cores) == said


def test_a_two_process_cpu_launch_says_it_will_not_be_faster(small_dataset, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # (the suite's workers set 1: as on a laptop, unset)
    result = run_in_this_process(
        "run",
        *TINY,
        "--num_epochs=1",
        "--num_warmup_epochs=0.5",
        "--backend=gloo",
        "--nproc_per_node=2",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    cores = len(os.sched_getaffinity(0))
    said = [line for line in result.stderr.splitlines() if "processes" in line and "cores" in line]
    assert len(said) == 1 and ("expect no speed-up" in said[0] or "expect a slower run" in said[0]), said
    assert f"this machine's {cores} cores" in said[0]


def slowed_steps(monkeypatch: pytest.MonkeyPatch, seconds: Callable[[Any, int], float]) -> None:
    """Every probe step sleeps ``seconds(precision, batch size)`` on top of its work (a slow or busy machine)."""
    real_step = doctor.plain_training_step

    def slowed(model, optimizer, loss_fn, precision):
        step = real_step(model, optimizer, loss_fn, precision)

        def slow_step(inputs, targets):
            time.sleep(seconds(precision, len(inputs)))
            return step(inputs, targets)

        return slow_step

    monkeypatch.setattr(doctor, "plain_training_step", slowed)


def test_doctor_does_not_advise_on_a_setting_too_slow_to_time_and_keeps_its_budget(monkeypatch):
    """bf16 emulated on a CPU without it (a step of 0.3 s here): under 3 timed steps fit in its 1 s, so it is
    'not measurable here', with no speed advised from it; the probe stays within (settings + 1) x its budget
    plus one warm-up step."""
    fake_cpu(monkeypatch, AVX2_ONLY)
    slowed_steps(monkeypatch, lambda precision, batch: 0.3 if precision.dtype is not None else 0.0)
    started = time.perf_counter()
    report = api.doctor("simple_cnn", batch_size=8, budget_seconds=1.0)  # bf16: 0.3 s warm-up, then 2 steps fit
    assert time.perf_counter() - started < 4 * 1.0 + 0.3 + 1.0  # + 1 s for everything but the probe
    fp32, layout, bf16 = report.probes
    assert fp32.steps >= 3 and fp32.relative_to_fp32 == 1.0 and fp32.verdict == "the reference"
    assert bf16.steps < 3 and bf16.relative_to_fp32 is None and bf16.images_per_second == 0.0
    assert re.fullmatch(
        r"not measurable here: [0-2] steps after a (0\.[3-9]\d|[1-9]\d*\.\d\d) s warm-up fit in its "
        r"budget, 3 needed",
        bf16.verdict,
    )
    assert (
        "this CPU has no native bf16: bf16 autocast is emulated, many times slower than fp32; keep with_amp=auto "
        "or False"
    ) in report.advice
    assert not any("x slower" in line for line in report.advice)
    assert "bf16 autocast + channels_last not measurable" in report.advice[0]
    text = doctor.render(report)
    assert re.search(r"\n  bf16 autocast \+ channels_last +not measurable here: ", text), text


def test_doctor_probes_a_smaller_batch_when_fp32_is_too_slow_for_three_steps(monkeypatch):
    # 0.32 s a step at batch 64: no second step fits in 0.6 s; batch 16 (0.08 s a step) leaves room for 3 and more
    # on a busy machine
    slowed_steps(monkeypatch, lambda precision, batch: 0.005 * batch)
    report = api.doctor("simple_cnn", batch_size=64, budget_seconds=0.6)
    assert report.probe_batch_size == 16 and report.probes[0].steps >= 3
    assert "probe: training steps of simple_cnn, batch 16, on cpu, about 0.6 s per setting" in doctor.render(report)


def test_channels_last_beyond_fp32_noise_is_advised_against_however_fast_it_is():
    fp32 = doctor.Timing(8, 0.05, (0.021, 0.020, 0.019, 0.020, 0.022))
    faster = doctor.result_of("fp32 + channels_last", doctor.Timing(8, 0.05, (0.010, 0.011, 0.010, 0.012)), fp32)
    probes = [doctor.result_of("fp32", fp32, fp32), faster]
    auto = automatic_precision(torch.device("cpu"))
    noisy = layout_numerics.LayoutNumerics(contiguous_error=1e-6, channels_last_error=4e-3, layers=6)
    advice = doctor.advise(probes, auto, torch.device("cpu"), noisy)
    assert (
        "keep channels_last=False on this CPU: it changes this model's fp32 numbers beyond noise "
        "(channels_last=auto leaves it off here)" in advice
    )
    assert not any(line.startswith("use channels_last=True") for line in advice)
    exact = layout_numerics.LayoutNumerics(contiguous_error=1e-6, channels_last_error=2e-6, layers=6)
    assert "use channels_last=True for this model in fp32 (1.90x, beyond the spread)" in doctor.advise(
        probes, auto, torch.device("cpu"), exact
    )


@pytest.mark.parametrize(
    ("steps", "verdict", "advice"),
    [
        (
            (0.010, 0.011, 0.010, 0.012),
            "faster",
            "use channels_last=True for this model in fp32 (1.90x, beyond the spread)",
        ),
        (
            (0.030, 0.031, 0.030, 0.029),
            "slower",
            "keep channels_last=False for this model in fp32 (0.67x, beyond the spread)",
        ),
        (
            (0.015, 0.025, 0.040, 0.020),
            "no difference measurable here",
            "channels_last: no difference measurable here in fp32 (0.89x within the spread of 4 steps)",
        ),
    ],
)
def test_a_setting_is_called_faster_or_slower_only_beyond_the_spread(steps, verdict, advice):
    fp32 = doctor.Timing(8, 0.05, (0.021, 0.020, 0.019, 0.020, 0.022))
    layout = doctor.result_of("fp32 + channels_last", doctor.Timing(8, 0.05, steps), fp32)
    assert layout.verdict == verdict
    assert doctor.channels_last_advice(layout) == advice


class DeviceReads(TorchDispatchMode):
    """Counts the operations that make the host wait for the device: a tensor's value read into Python
    (``.item()``, ``float()``, ``bool()``, ``.tolist()`` of a scalar) and copies from another device to the CPU."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            self.count += 1
        elif func in (torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default):
            source = args[1] if func is torch.ops.aten.copy_.default else args[0]
            target = args[0].device if func is torch.ops.aten.copy_.default else kwargs.get("device")
            if isinstance(source, torch.Tensor) and source.device.type != "cpu" and str(target) == "cpu":
                self.count += 1
        return func(*args, **kwargs)


def test_training_iterations_never_wait_for_the_device_between_logs():
    """Runs of 40 and 80 iterations with no log, checkpoint or epoch end in between: the same number of device
    reads (set-up and the one evaluation), none per training iteration."""

    def reads(iterations: int) -> int:
        with tempfile.TemporaryDirectory() as output, DeviceReads() as counter:
            api.train(
                api.resolve(
                    "configs/demo.yaml",
                    synthetic_size=1000,
                    batch_size=8,
                    epoch_length=iterations,
                    num_epochs=1,
                    num_warmup_epochs=0,
                    log_every_iters=1000,
                    checkpoint_every=1000,
                    train_eval_size=0,
                    output_path=output,
                )
            )
        return counter.count

    assert reads(80) == reads(40) > 0


def test_nan_between_reads_is_found_at_the_next_read_with_its_iteration(small_dataset, tmp_path):
    result = run_in_this_process(
        "run",
        *TINY,
        "--learning_rate=1e30",
        "--log_every_iters=4",
        "--checkpoint_every=4",
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=nan",
    )
    assert result.returncode == 3, result.stderr[-3000:]
    match = re.fullmatch(
        r"error: training stopped at iteration (\d+) \(epoch 1\): the loss became (nan|inf) at "
        r"iteration (\d+) on at least one process; the checkpoints on disk are from before it \(try "
        r"a lower learning_rate\)",
        result.stderr.strip().splitlines()[-1],
    )
    assert match, result.stderr[-2000:]
    stopped, first = int(match[1]), int(match[3])
    assert stopped % 4 == 0 and stopped - 4 < first <= stopped
    assert all(int(path.stem.rsplit("_", 1)[1]) < first for path in (tmp_path / "nan").glob("training_checkpoint_*"))


def test_the_cpu_family_tells_apart_the_kinds_one_model_name_covers(monkeypatch):
    lines = [
        "processor\t: 0",
        "vendor_id\t: AuthenticAMD",
        "cpu family\t: 26",
        "model\t\t: 2",
        "model name\t: AMD EPYC",
        "",
        "processor\t: 1",
        "cpu family\t: 99",
        "model\t\t: 9",
    ]
    monkeypatch.setattr(hardware, "_cpuinfo_lines", lambda: lines)
    assert hardware.cpu_family() == "26/2"
    monkeypatch.setattr(hardware, "_cpuinfo_lines", lambda: ["model name\t: Apple M2"])
    assert hardware.cpu_family() == ""


def test_an_interpreter_started_with_the_avx2_only_emulation_computes_and_chooses_as_that_kind():
    """benchmarks/avx2_only on PYTHONPATH (``python -m benchmarks.suite --emulate=avx2``): in an interpreter started
    with it (a new one: torch reads its kernel level once), torch's kernels run at AVX2, oneDNN is held to AVX2,
    get_capabilities shows no AVX-512 or AMX, and with_amp=auto chooses fp32, as on that kind."""
    code = (
        "import json, os, torch\n"
        "from cifar10_dist.system import hardware\n"
        "from cifar10_dist.system.precision import choose_precision\n"
        "info = hardware.cpu_info()\n"
        "shown = [key for key, value in torch.cpu.get_capabilities().items() if value is True]\n"
        "print(json.dumps({'capability': info.capability, 'native_bf16': info.native_bf16, 'shown': shown,\n"
        "    'onednn': os.environ.get('ONEDNN_MAX_CPU_ISA'),\n"
        "    'dtype': str(choose_precision(torch.device('cpu'), 'auto').dtype)}))\n"
    )
    env = suite.emulating("avx2", REPO)  # the environment benchmarks.suite --emulate=avx2 runs the suite in
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    seen = json.loads(result.stdout)
    assert seen["capability"] == "AVX2" and seen["onednn"] == "AVX2"
    assert seen["native_bf16"] is False and seen["dtype"] == "None"
    assert not [key for key in seen["shown"] if key.startswith(("avx512", "amx"))], seen["shown"]
    assert "avx2" in seen["shown"]  # the rest of the machine's capabilities as they are

"""This machine as the AVX2-only kind without native bf16, for a measurement on a faster kind: put this folder on
PYTHONPATH and every interpreter that starts with it (pytest, the CLI, their workers) runs torch's kernels at AVX2
(ATEN_CPU_CAPABILITY), oneDNN's at AVX2 (ONEDNN_MAX_CPU_ISA: bf16 emulated, as there), and sees no AVX-512 or AMX in
``torch.cpu.get_capabilities`` (so ``with_amp=auto`` and ``doctor`` decide as there). The clock, caches and cores
stay this machine's: a figure taken so is this machine's with that kind's code paths, not that kind's own.

    PYTHONPATH=benchmarks/avx2_only cifar10-dist doctor
    python -m benchmarks.suite --emulate=avx2
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

os.environ.setdefault("ATEN_CPU_CAPABILITY", "avx2")
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")

HIDDEN = ("avx512", "amx")  # the capability names this kind lacks


class _TorchCpuWithoutAvx512:
    """Finds ``torch.cpu`` as usual and, once it has run, hides HIDDEN from its ``get_capabilities``."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            reported = module.get_capabilities

            def get_capabilities() -> dict[str, Any]:
                return {key: (False if key.startswith(HIDDEN) else value) for key, value in reported().items()}

            module.get_capabilities = get_capabilities

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _TorchCpuWithoutAvx512())

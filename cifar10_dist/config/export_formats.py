"""The export formats, one record each (plain data, no torch: the help pages read it too): the file suffix, the
packages it needs beyond torch, the function of ``exporting`` that writes and verifies it, what reads it back for
the check, and its help line. Every place that lists formats (``exporting``, the CLI and its help, the API,
docs/models-in-and-out.md) reads or is checked against ``FORMATS``; a new format is one record here and its
writer in ``exporting``."""

from __future__ import annotations

from dataclasses import dataclass

INSTALL_HINT = "pip install 'cifar10-dist[export]'"


@dataclass(frozen=True)
class ExportFormat:
    name: str
    suffix: str  # of the file written next to the checkpoint by default
    needs: tuple[str, ...]  # packages beyond torch
    writer: str  # the function of deployment.exporting that writes it and checks it against the PyTorch model
    verified_by: str  # what loads it back for that check
    help: str  # one line: what the file holds


FORMATS: dict[str, ExportFormat] = {
    record.name: record
    for record in (
        ExportFormat(
            "safetensors",
            ".safetensors",
            ("safetensors",),
            "write_safetensors",
            "safetensors read back into the model",
            "the weights",
        ),
        ExportFormat("pt2", ".pt2", (), "write_pt2", "torch.export.load", "a torch.export program, dynamic batch size"),
        ExportFormat(
            "onnx",
            ".onnx",
            ("onnx", "onnxscript", "onnxruntime"),
            "write_onnx",
            "ONNX Runtime (CPU)",
            "an ONNX graph, dynamic batch size (checked by onnx.checker, then ONNX Runtime)",
        ),
        ExportFormat(
            "torchscript",
            ".torchscript.pt",
            (),
            "write_torchscript",
            "torch.jit.load",
            "a traced module (deprecated by torch: use pt2)",
        ),
    )
}
NAMES = "|".join(FORMATS)  # safetensors|pt2|onnx|torchscript


def exported_format(path: str) -> ExportFormat | None:
    """The export format a file is by its suffix (None: not one of ours, e.g. a checkpoint's .pt)."""
    return next((record for record in FORMATS.values() if str(path).endswith(record.suffix)), None)

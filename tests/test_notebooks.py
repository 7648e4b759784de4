"""notebooks/: the Jupyter notebook runs to the end in a real kernel (smoke mode: 2 forked gloo processes on
synthetic data); both notebooks are committed without outputs and their code parses."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import REPO

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
def test_the_jupyter_notebook_trains_with_two_processes_from_a_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("CIFAR10_DIST_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the notebook trains into a fresh temporary folder
    monkeypatch.setenv("PYTHONPATH", str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    notebook = nbformat.read(REPO / "notebooks" / "train_in_jupyter.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outputs = "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )
    assert "simple_cnn_backend-gloo-2_" in outputs  # the run folder names backend and world size
    assert "test accuracy" in outputs and "notebook finished" in outputs


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_notebooks_are_committed_without_outputs_and_parse(path: Path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: clear the outputs"
        python = "\n".join(
            "pass" if line.lstrip().startswith(("!", "%")) else line for line in cell.source.splitlines()
        )
        ast.parse(python)

"""The package as a user installs it: a wheel built from this checkout holds the configs, the licence and the
typing marker; installed alone into a folder outside the checkout (inside another project's git repository), it
answers --version, trains the shipped demo by name from another folder, and records its version and no foreign
commit. The API the README names imports from the package; a downloaded weights file that is not the published
one is refused."""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

import cifar10_dist
from tests.conftest import REPO

WHEEL = re.compile(r"cifar10_dist-(.+)-py3-none-any\.whl")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheel")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(folder), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = folder.glob("cifar10_dist-*.whl")
    return found


def test_the_wheel_holds_the_configs_the_licence_the_typing_marker_and_one_version(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    shipped = sorted(path.name for path in (REPO / "cifar10_dist" / "configs").glob("*.yaml"))
    assert sorted(Path(name).name for name in names if name.startswith("cifar10_dist/configs/")) == shipped
    assert "cifar10_dist/py.typed" in names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), names[-8:]
    metadata = zipfile.ZipFile(wheel).read(next(name for name in names if name.endswith("METADATA"))).decode()
    assert "\nLicense-Expression: BSD-3-Clause\n" in metadata and "\nRequires-Dist: Pillow>=9.0\n" in metadata
    assert f"\nVersion: {cifar10_dist.__version__}\n" in metadata
    assert WHEEL.fullmatch(wheel.name).group(1) == cifar10_dist.__version__


def test_the_installed_wheel_trains_the_shipped_demo_from_another_folder_and_records_no_foreign_commit(wheel, tmp_path):
    project = tmp_path / "someone-elses-project"  # a user's own git repository, the package installed inside it
    project.mkdir()
    for command in (
        ["init", "-q"],
        ["-c", "user.email=u@x", "-c", "user.name=u", "commit", "-q", "--allow-empty", "-m", "theirs"],
    ):
        subprocess.run(["git", "-C", str(project), *command], check=True, capture_output=True)
    target = project / ".packages"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    env = {
        **{key: value for key, value in os.environ.items() if key != "PYTHONPATH"},
        "PYTHONPATH": str(target),
        "OMP_NUM_THREADS": "1",
    }

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "cifar10_dist", *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    where = subprocess.run(
        [sys.executable, "-c", "import cifar10_dist; print(cifar10_dist.__file__)"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert where.stdout.startswith(str(target)), where  # the installed copy runs, not the checkout
    assert cli("--version").stdout == f"cifar10-dist {cifar10_dist.__version__}\n"
    assert "demo " in cli("config", "--list").stdout
    run = cli("run", "--config=demo", "--num_epochs=1", "--synthetic_size=400", "--output_path=out", "--run_name=demo")
    assert run.returncode == 0, run.stderr[-3000:]
    package = json.loads((project / "out" / "demo" / "provenance.json").read_text())["package"]
    assert package == {
        "name": "cifar10-dist",
        "version": cifar10_dist.__version__,
        "git_commit": None,
        "git_dirty": None,
        "release": re.fullmatch(r"[\d.]+", cifar10_dist.__version__) is not None,
    }


def test_the_api_the_readme_names_imports_from_the_package_and_the_docs_list_what_it_exports():
    readme = (REPO / "README.md").read_text()
    start = readme.index("The same from Python")
    paragraph = readme[start : readme.index("```python", start)]
    named = re.findall(r"`(\w+)`", paragraph)
    assert {"train", "evaluate", "lr_find", "tune", "report", "prepare_data"} <= set(named)
    for name in named:
        if name not in ("Config", "cifar10_dist"):
            assert name in cifar10_dist.__all__ and callable(getattr(cifar10_dist, name)), name
    calls = [
        name
        for name in cifar10_dist.__all__
        if name[0].islower()
        and callable(getattr(cifar10_dist, name))
        and name not in ("load_config", "shipped_configs", "resolve")
    ]
    listed = next(
        line for line in (REPO / "docs" / "development.md").read_text().splitlines() if line.startswith("api ")
    )
    assert re.findall(r"(\w+)(?:,|$)", listed.split(":", 1)[1]) == calls
    assert (Path(cifar10_dist.__file__).parent / "py.typed").is_file()


def test_a_downloaded_weights_file_unlike_its_published_hash_is_refused_and_not_kept(tmp_path):
    from cifar10_dist.errors import UserError
    from cifar10_dist.models import pretrained

    served = tmp_path / "served"
    served.mkdir()
    (served / "resnet18-f37072fd.pth").write_bytes(b"not the weights")

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cache = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
        weights = pretrained.Weights(
            "torchvision",
            "IMAGENET1K_V1",
            str(cache),
            asked="DEFAULT",
            url=f"http://127.0.0.1:{server.server_port}/resnet18-f37072fd.pth",
        )
        with pytest.raises(
            UserError,
            match=r"^pretrained=DEFAULT: the file downloaded from http://127\.0\.0\.1:\d+/"
            r"resnet18-f37072fd\.pth has SHA-256 [0-9a-f]{12}\.\.\., and its name "
            r"resnet18-f37072fd\.pth says it begins with f37072fd: it was not kept",
        ):
            pretrained.fetch(weights)
        assert not cache.exists() and list(cache.parent.iterdir()) == []
    finally:
        server.shutdown()


# ---------------------------------------------------------------- the package as released (issue 73)


def build(kind: str, folder: Path) -> Path:
    """The sdist or editable wheel setuptools builds from this checkout (its own hooks: no network, no isolation)."""
    code = f"from setuptools import build_meta; print(build_meta.build_{kind}({str(folder)!r}))"
    built = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    return folder / built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    return build("sdist", tmp_path_factory.mktemp("sdist"))


def test_the_sdist_holds_what_the_readme_links_and_no_suite_that_cannot_run(sdist):
    names = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
    linked = re.findall(r"\]\(([^)#:]+)\)", (REPO / "README.md").read_text())
    assert linked and [target for target in linked if target not in names] == []
    assert {"CHANGELOG.md", "LICENSE", "examples/my_model.py", "cifar10_dist/py.typed"} <= names
    assert not [name for name in names if name.startswith("tests/")]


def test_an_sdist_unpacked_inside_another_git_repository_records_none_of_its_commits(sdist, tmp_path):
    project = tmp_path / "theirs"  # a user's repository that vendors the sdist
    project.mkdir()
    for command in (
        ["init", "-q"],
        ["-c", "user.email=u@x", "-c", "user.name=u", "commit", "-q", "--allow-empty", "-m", "theirs"],
    ):
        subprocess.run(["git", "-C", str(project), *command], check=True, capture_output=True)
    with tarfile.open(sdist) as archive:
        archive.extractall(project / "vendor", filter="data")
    unpacked = next((project / "vendor").iterdir())
    code = "import json; from cifar10_dist.outputs import provenance; print(json.dumps(provenance.git_state()))"
    env = {**os.environ, "PYTHONPATH": str(unpacked), "OMP_NUM_THREADS": "1"}
    found = subprocess.run(
        [sys.executable, "-c", code], cwd=unpacked, env=env, capture_output=True, text=True, timeout=120
    )
    assert json.loads(found.stdout) == {"git_commit": None, "git_dirty": None}, found.stderr[-2000:]


def test_a_tree_with_unreleased_changes_has_a_development_version_that_runs_record_as_such():
    from cifar10_dist.outputs import provenance

    changelog = (REPO / "CHANGELOG.md").read_text()
    unreleased = changelog.split("## Unreleased", 1)[1].split("\n## ", 1)[0]
    released = re.search(r"^## (\d+\.\d+\.\d+) \(", changelog, re.MULTILINE).group(1)
    if re.search(r"^- ", unreleased, re.MULTILINE):
        assert re.fullmatch(r"\d+\.\d+\.\d+\.dev\d+", cifar10_dist.__version__), cifar10_dist.__version__
        assert tuple(map(int, cifar10_dist.__version__.split(".")[:3])) > tuple(map(int, released.split(".")))
    assert [provenance.is_release(v) for v in ("0.1.0", "1.2.0rc1", "0.1.1.dev0", "0.1.0+local")] == [
        True,
        True,
        False,
        False,
    ]


def test_the_editable_install_is_a_path_entry_that_type_checkers_follow(tmp_path):
    """setuptools' editable import hook is invisible to mypy and IDEs; a path entry is not."""
    with zipfile.ZipFile(build("editable", tmp_path)) as wheel:
        (pth,) = [name for name in wheel.namelist() if name.endswith(".pth")]
        assert wheel.read(pth).decode().strip() == str(REPO)
        assert not [name for name in wheel.namelist() if name.endswith("_finder.py")]


def test_the_readme_python_example_type_checks_and_a_users_mistake_is_found(tmp_path):
    """As after README line 1: mypy, run outside the checkout, finds the installed package and its types."""
    example = re.search(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL).group(1)
    (tmp_path / "example.py").write_text(example)
    (tmp_path / "mistake.py").write_text("from cifar10_dist import evaluate\nevaluate(78)\n")
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "MYPYPATH")}

    def mypy(name: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--no-incremental", name],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    assert mypy("example.py").stdout.startswith("Success: no issues found"), mypy("example.py").stdout
    found = mypy("mistake.py")
    assert 'error: Argument 1 to "evaluate" has incompatible type "int"; expected "str | Path"' in found.stdout, (
        found.stdout + found.stderr
    )

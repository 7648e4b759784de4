"""A run's plan (training.setup.plan): every choice a run makes for itself is settled once, logged once as a
table, and written into config.yaml as the value taken; a run started from that config.yaml makes the same
choices; where a resumed run continued from is its provenance's, never config.yaml's."""

from __future__ import annotations

import json

import yaml

from tests.conftest import TINY, run_in_this_process

ONE_EPOCH = [*TINY, "--num_epochs=1", "--num_warmup_epochs=0.5", "--checkpoint_every=9"]
CHOSEN_BY_THE_RUN = [
    "--with_amp=auto",
    "--channels_last=auto",
    "--num_workers=auto",
    "--class_weights=auto",
    "--resume_from=auto",
    "--learning_rate=find",
]


def settled(run_dir) -> dict:
    return yaml.safe_load((run_dir / "config.yaml").read_text())


def test_config_yaml_holds_what_the_run_chose_and_a_run_from_it_chooses_the_same(small_dataset, tmp_path):
    first = run_in_this_process(
        "run",
        *ONE_EPOCH,
        *CHOSEN_BY_THE_RUN,
        f"--data_path={small_dataset}",
        f"--output_path={tmp_path}",
        "--run_name=first",
    )
    assert first.returncode == 0, first.stderr[-3000:]
    config = settled(tmp_path / "first")
    left = {key: value for key, value in config.items() if value in ("auto", "find")}
    assert left in ({}, {"amp_dtype": "auto"}) and (left == {} or config["with_amp"] is False), left
    assert config["learning_rate"] > 0 and config["resume_from"] is None and config["num_workers"] == 0
    weights = [float(weight) for weight in config["class_weights"].split(",")]
    recorded = json.loads((tmp_path / "first" / "provenance.json").read_text())["class_weights"]
    assert len(weights) == 10 and weights == recorded  # the inverse class frequencies the loss used
    log = (tmp_path / "first" / "run.log").read_text()
    assert log.count("INFO plan (what this run chose for itself; config.yaml records it):") == 1
    assert "  learning_rate     " in log and "(given: find)" in log

    again = run_in_this_process(
        "run", f"--config={tmp_path / 'first' / 'config.yaml'}", "--run_name=again", "--overwrite=False"
    )
    assert again.returncode == 0, again.stderr[-3000:]
    repeated = settled(tmp_path / "again")
    assert {key: value for key, value in repeated.items() if key != "run_name"} == {
        key: value for key, value in config.items() if key != "run_name"
    }


def test_a_resumed_run_records_the_checkpoint_it_continued_from_in_provenance_and_none_in_its_config(
    small_dataset, tmp_path
):
    """config.yaml is a recipe for a new run (replaying it trains from the start); where the run continued from
    is its provenance."""
    common = [*ONE_EPOCH, "--num_epochs=2", f"--data_path={small_dataset}", f"--output_path={tmp_path}"]
    assert run_in_this_process("run", *common, "--run_name=job", "--checkpoint_every=18").returncode == 0
    checkpoint = tmp_path / "job" / "training_checkpoint_18.pt"
    resumed = run_in_this_process("run", *common, "--run_name=on", f"--resume_from={checkpoint}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert settled(tmp_path / "on")["resume_from"] is None
    assert json.loads((tmp_path / "on" / "provenance.json").read_text())["resumed_from"] == str(checkpoint)


def test_the_plan_is_settled_once_before_anything_is_built_and_never_read_once_training_starts(
    small_dataset, tmp_path, monkeypatch
):
    """Every planner call and every read of the Plan happen before ``run_to_the_end`` (the warm-up and the
    training loop); ``settle`` is called once per process."""
    from cifar10_dist.training import run
    from cifar10_dist.training.setup import plan

    events: list[str] = []
    for name in ("settle", "data_choices", "class_weights_taken", "warm_up_steps_for", "precision_unlogged"):
        original = getattr(plan, name)
        monkeypatch.setattr(
            plan, name, lambda *args, _f=original, _n=name, **kwargs: events.append(_n) or _f(*args, **kwargs)
        )
    plans: list[plan.Plan] = []

    def read(self, attribute):
        events.append(f"read {attribute}")
        if attribute == "config":
            plans.append(self)
        return object.__getattribute__(self, attribute)

    monkeypatch.setattr(plan.Plan, "__getattribute__", read)
    to_the_end = run.run_to_the_end
    monkeypatch.setattr(run, "run_to_the_end", lambda *a, **k: events.append("training starts") or to_the_end(*a, **k))
    result = run_in_this_process(
        "run", *ONE_EPOCH, f"--data_path={small_dataset}", f"--output_path={tmp_path}", "--run_name=p"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    start = events.index("training starts")
    assert events.count("settle") == 1 and events.index("settle") < start
    assert "read config" in events[:start] and "read precision" in events[:start]  # the spy sees the reads
    assert events[start + 1 :] == []  # nothing planned or read after training starts
    plans[0].config  # noqa: B018 - a read after the run: the spy records it (so a read in training would show)
    assert events[-1] == "read config"

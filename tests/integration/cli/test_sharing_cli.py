"""`nodeagent sharing apply|assert|export` and `nodeagent labels -f -c` on an emulated 8xH200
node with the fake MPS daemon: exit codes, plans, what each GPU offers."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from nodeagent.mps.control import MpsControl
from tests.integration.test_sharing_convergence import CONFIGS
from tests.support.cli import Result, assert_one_error


@pytest.fixture
def sharing(
    cli: Callable[..., Result], tmp_path: Path, fake_mps_control: str
) -> Iterator[Callable[..., Result]]:
    (tmp_path / "sharing.yaml").write_text(CONFIGS)
    base = ["--simulate", "h200x8", "--sim-state", str(tmp_path / "node.json")]
    mps = ["--mps-control", fake_mps_control, "--mps-root", str(tmp_path / "mps")]

    def run(command: str, *args: str) -> Result:
        if command == "labels":
            env = {"NODEAGENT_MPS_CONTROL": fake_mps_control}  # checked as apply checks it
            return cli(*base, "labels", "-f", str(tmp_path / "sharing.yaml"), *args, env=env)
        return cli(*base, "sharing", command, "-f", str(tmp_path / "sharing.yaml"), *mps, *args)

    yield run
    control = MpsControl(fake_mps_control, tmp_path / "mps" / "pipe", tmp_path / "mps" / "log")
    if control.daemon_pid() is not None:
        control.command("quit")


def test_apply_assert_export(
    sharing: Callable[..., Result],
    cli: Callable[..., Result],
    tmp_path: Path,
    fake_mps_control: str,
) -> None:
    assert sharing("assert", "-c", "mixed").returncode == 1
    plan = sharing("apply", "-c", "mixed", "--dry-run", "-o", "json")
    assert plan.returncode == 0, plan.stderr
    data = json.loads(plan.stdout)
    assert data["dry_run"] and len(data["operations"]) == 18 and data["mps"] == "start"
    assert data["gpus"]["4"] == {"sharing": "time-slicing", "replicas": 4}
    assert sharing("assert", "-c", "mixed").returncode == 1  # a dry run changed nothing
    text = sharing("apply", "-c", "mixed", "--dry-run").stdout
    assert "MPS daemon: start (planned)" in text
    assert "label nodeagent.io/gpu.4.sharing: whole -> time-slicing" in text
    done = sharing("apply", "-c", "mixed")
    assert done.returncode == 0, done.stderr
    assert "GPU 2: mps x4" in done.stdout and "ran 18 NVML operations" in done.stdout
    check = sharing("assert", "-c", "mixed")
    assert check.returncode == 0 and "the GPUs match" in check.stdout
    assert sharing("assert", "-c", "rotated").returncode == 1
    export = cli("--simulate", "h200x8", "--sim-state", str(tmp_path / "node.json"), "sharing",
                 "export", "--mps-control", fake_mps_control, "--mps-root", str(tmp_path / "mps"))  # fmt: skip
    assert export.returncode == 0, export.stderr
    current = yaml.safe_load(export.stdout)["sharing-configs"]["current"]
    kinds = {tuple(e["devices"]): next(k for k in e if k != "devices") for e in current}
    assert kinds[(0, 1)] == "mig" and kinds[(2, 3)] == "mps" and kinds[(4, 5, 6, 7)] == "whole"
    (tmp_path / "current.yaml").write_text(export.stdout)
    again = cli("--simulate", "h200x8", "--sim-state", str(tmp_path / "node.json"), "sharing",
                "assert", "-f", str(tmp_path / "current.yaml"), "-c", "current",
                "--mps-control", fake_mps_control, "--mps-root", str(tmp_path / "mps"))  # fmt: skip
    assert again.returncode == 0, (again.stdout, again.stderr)


def test_labels_of_a_sharing_config(sharing: Callable[..., Result]) -> None:
    res = sharing("labels", "-c", "rotated", "-o", "json")
    assert res.returncode == 0, res.stderr
    labels = json.loads(res.stdout)["labels"]
    assert labels["nodeagent.io/gpu.0.sharing"] == "mps"
    assert labels["nodeagent.io/gpu.0.replicas"] == "4"
    assert labels["nodeagent.io/gpu.5.sharing"] == "time-slicing"
    assert labels["nodeagent.io/gpu.2.sharing"] == "mig"
    assert labels["nvidia.com/mps.capable"] == "true"


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (("apply", "-c", "nope"), 2, ("no config named 'nope'",)),
        (("apply",), 2, ("no sharing config name",)),
        (("assert", "-c", "nope"), 2, ("no config named 'nope'",)),
    ],
)
def test_bad_input(
    sharing: Callable[..., Result], args: tuple[str, ...], code: int, words: tuple[str, ...]
) -> None:
    assert_one_error(sharing(*args), code, *words)


def test_status_shows_how_each_gpu_is_shared(
    sharing: Callable[..., Result], cli: Callable[..., Result], tmp_path: Path
) -> None:
    assert sharing("apply", "-c", "rotated").returncode == 0
    res = cli(
        "--simulate", "h200x8", "--sim-state", str(tmp_path / "node.json"), "status", "-o", "json"
    )
    shared = json.loads(res.stdout)["sharing"]
    assert shared["2"] == "mig" and shared["4"] == "whole"
    text = cli("--simulate", "h200x8", "--sim-state", str(tmp_path / "node.json"), "status").stdout
    assert "  sharing mig" in text and "  sharing whole" in text

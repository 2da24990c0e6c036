"""`nodeagent plan` on emulated nodes: the planned sharing config applies as it is (`sharing
apply`, then `sharing assert` holds and the GPUs have the planned slices and MPS limits), the
mig-parted output applies with `mig apply`, and bad input is one sentence with exit 2."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from nodeagent.sharing.config import MpsShare, parse_sharing
from tests.support.cli import Result, assert_one_error, emulated_mps_node

VOICE = """\
version: nodeagent/v1
workloads:
  - {name: llm, replicas: 4, memory: 38G, isolation: mig, priority: 10}
  - {name: asr, replicas: 8, memory: 9G, isolation: shared, compute: 0.1}
  - {name: tts, replicas: 8, memory: 9G, isolation: shared, compute: 0.1}
"""
MIG_ONLY = """\
version: nodeagent/v1
workloads:
  - {name: llm, replicas: 3, memory: 38G, isolation: mig}
  - {name: embed, replicas: 4, memory: 8G, isolation: mig}
  - {name: train, replicas: 1, memory: 100G, isolation: exclusive}
"""


@pytest.fixture
def node(
    cli: Callable[..., Result], tmp_path: Path, fake_mps_control: str
) -> Iterator[Callable[..., Result]]:
    with emulated_mps_node(tmp_path, fake_mps_control, "h200x4") as (base, mps):

        def run(*args: str) -> Result:
            if args[0] == "sharing" and args[1] in ("apply", "assert"):
                return cli(*base, *args, *mps)
            return cli(*base, *args)

        yield run


def test_planned_sharing_config_applies_as_it_is(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    (tmp_path / "w.yaml").write_text(VOICE)
    res = node("plan", "-f", "w.yaml", "-o", "yaml")
    assert res.returncode == 0, res.stderr
    (tmp_path / "out.yaml").write_text(res.stdout)
    cfg = parse_sharing(res.stdout, "out.yaml")  # the file sharing apply reads, unchanged
    entries = cfg.configs["planned"]
    mps = [e.share for e in entries if isinstance(e.share, MpsShare)]
    assert mps and all(m.thread_percentage == 10 for m in mps)
    data = json.loads(node("plan", "-f", "w.yaml", "-o", "json").stdout)
    assert data["report"]["gpus_used"] == 4 and data["report"]["not_placed"] == []
    assert len(data["assignment"]) == 20
    assert data["sharing_config"] == yaml.safe_load(res.stdout)
    assert data["mig_config"] is None  # MPS is used: mig-parted cannot say it

    applied = node("sharing", "apply", "-f", "out.yaml", "-c", "planned")
    assert applied.returncode == 0, applied.stderr
    assert node("sharing", "assert", "-f", "out.yaml", "-c", "planned").returncode == 0

    status = json.loads(node("status", "-o", "json").stdout)
    by_gpu = {g["index"]: g for g in status["gpus"]}
    for gpu in data["gpus"]:
        slices = by_gpu[gpu["gpu"]]["slices"]
        if gpu["sharing"] == "mig":
            have: dict[str, int] = {}
            for s in slices:
                have[s["profile"]] = have.get(s["profile"], 0) + 1
            assert have == gpu["mig-devices"]
            placements = {(s["profile"], s["placement"]["start"]) for s in slices}
            for a in data["assignment"]:
                if a["gpu"] == gpu["gpu"]:  # each replica's slice exists where the plan says
                    assert (a["profile"], a["placement"]["start"]) in placements
        else:
            assert slices == [] and not by_gpu[gpu["gpu"]]["mig_current"]


def test_mig_parted_output_applies_with_mig_apply(
    node: Callable[..., Result], tmp_path: Path
) -> None:
    (tmp_path / "w.yaml").write_text(MIG_ONLY)
    res = node("plan", "-f", "w.yaml", "-o", "mig-parted")
    assert res.returncode == 0, res.stderr
    (tmp_path / "mig.yaml").write_text(res.stdout)
    assert yaml.safe_load(res.stdout)["version"] == "v1"
    applied = node("mig", "apply", "-f", "mig.yaml", "-c", "planned")
    assert applied.returncode == 0, applied.stderr
    assert node("mig", "assert", "-f", "mig.yaml", "-c", "planned").returncode == 0
    text = node("plan", "-f", "w.yaml").stdout
    assert "placed 8 replicas on 3 of 4 GPUs; 1 left whole" in text


def test_text_report_names_what_is_not_placed(node: Callable[..., Result], tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(
        "version: nodeagent/v1\nworkloads:\n"
        "  - {name: huge, memory: 200G, isolation: mig}\n"
        "  - {name: many, replicas: 40, memory: 60G, isolation: exclusive}\n"
    )
    res = node("plan", "-f", "w.yaml")
    assert res.returncode == 1, res.stderr
    assert "not placed: huge x1: too big: needs 204800 MiB; no MIG slice" in res.stdout
    assert "not placed: many x36: out of capacity: 4 of 40 replicas placed" in res.stdout
    assert res.stderr.strip().splitlines()[-1] == (
        "nodeagent: 37 of 41 replicas do not fit this node; ran out of huge: bigger than any"
        " slice or GPU here"
    )


@pytest.mark.parametrize(
    ("workloads", "resource"),
    [
        (
            "  - {name: big, replicas: 6, memory: 60G, isolation: exclusive}\n",
            "GPUs: 6 exclusive replicas, 4 GPUs",
        ),
        (
            "  - {name: asr, replicas: 60, memory: 10G, isolation: shared}\n",
            "GPU memory: the replicas need 600 GiB",
        ),
        (
            "  - {name: asr, replicas: 20, memory: 1G, compute: 0.3, isolation: shared}\n",
            "compute: the replicas need 6 GPUs of compute, the node has 4",
        ),
    ],
)
def test_demand_that_does_not_fit_exits_1_naming_what_ran_out(
    node: Callable[..., Result], tmp_path: Path, workloads: str, resource: str
) -> None:
    (tmp_path / "w.yaml").write_text("version: nodeagent/v1\nworkloads:\n" + workloads)
    for output in ("text", "yaml", "json"):
        res = node("plan", "-f", "w.yaml", "-o", output)
        assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
        last = res.stderr.strip().splitlines()[-1]
        assert (
            last.startswith("nodeagent: ")
            and "do not fit this node; ran out of " + resource in last
        ), last
        assert res.stdout  # the plan is there all the same


def test_mps_plan_has_no_mig_parted_form(node: Callable[..., Result], tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(VOICE)
    assert_one_error(
        node("plan", "-f", "w.yaml", "-o", "mig-parted"), 2, "through MPS", "--output yaml"
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("version: nodeagent/v1\nworkloads: []\n", ["w.yaml:2:12", "empty list"]),
        (
            "version: nodeagent/v1\nworkloads: [{name: a, memory: 1G}]\n",
            ["w.yaml:2:13", "isolation"],
        ),
        ("]", ["w.yaml:1:1", "not valid YAML"]),
    ],
)
def test_bad_workload_file_is_one_sentence(
    node: Callable[..., Result], tmp_path: Path, text: str, words: list[str]
) -> None:
    (tmp_path / "w.yaml").write_text(text)
    assert_one_error(node("plan", "-f", "w.yaml"), 2, *words)


def test_missing_file_and_empty_name(node: Callable[..., Result], tmp_path: Path) -> None:
    assert_one_error(node("plan", "-f", "nope.yaml"), 2, "cannot read workload file nope.yaml")
    (tmp_path / "w.yaml").write_text(VOICE)
    assert_one_error(node("plan", "-f", "w.yaml", "--name", " "), 2, "--name")


def test_plan_reads_stdin(cli: Callable[..., Result]) -> None:
    res = cli("--simulate", "a100-40gbx2", "plan", "-f", "-", "-o", "json", stdin=MIG_ONLY)
    assert res.returncode == 1 and "ran out of train" in res.stderr, res.stderr  # 'train' too big
    data = json.loads(res.stdout)
    assert [g["sharing"] for g in data["gpus"]] == ["mig", "mig"]
    reasons = {n["workload"]: n["reason"] for n in data["report"]["not_placed"]}
    assert reasons["train"].startswith("too big: needs 102400 MiB; no GPU of this node")


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (bytes(range(256)) * 4, ["not UTF-8"]),
        (
            b"version: nodeagent/v1\nworkloads: " + b"[" * 3000 + b"]" * 3000 + b"\n",
            ["not valid YAML"],
        ),
        (
            b"version: nodeagent/v1\nworkloads:\n  - &w {name: a, memory: lots, isolation: mig}\n"
            + b"".join(b"  - *w\n" for _ in range(200)),
            ["errors:", "and", "more"],
        ),
    ],
    ids=["random-bytes", "nested-3000", "aliases"],
)
def test_hostile_workload_files(
    node: Callable[..., Result], tmp_path: Path, content: bytes, words: list[str]
) -> None:
    (tmp_path / "w.yaml").write_bytes(content)
    res = node("plan", "-f", "w.yaml")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.startswith("nodeagent: ") and len(res.stderr) < 10_000
    for word in words:
        assert word in res.stderr, res.stderr


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("a\u2028b: c", "planned"),
        ("x\u2029- y", "planned"),
        ("# not a comment", "p\u2028q"),
        ("k: v\u2028other: 1", "p: q"),
    ],
    ids=["line-separator", "paragraph-separator", "hash", "separator-key"],
)
def test_plan_yaml_round_trips_names_with_line_separators(
    node: Callable[..., Result], tmp_path: Path, name: str, config: str
) -> None:
    """YAML takes U+2028/2029 as line breaks: in a comment they would end it and make the rest
    of a workload name part of the document. Shown escaped; the file reads back as planned."""
    workloads = {
        "version": "nodeagent/v1",
        "workloads": [{"name": name, "replicas": 2, "memory": "10G", "isolation": "mig"}],
    }
    (tmp_path / "w.yaml").write_text(json.dumps(workloads))
    res = node("plan", "-f", "w.yaml", "-o", "yaml", "--name", config)
    assert res.returncode == 0, res.stderr
    head = [line for line in res.stdout.split("\n") if line.startswith("#")]
    assert head[0].startswith("# GPU 0: mig: ") and "\u2028" not in res.stdout
    document = yaml.safe_load(res.stdout)
    assert list(document) == ["version", "sharing-configs"]
    assert list(document["sharing-configs"]) == [config]
    planned = json.loads(node("plan", "-f", "w.yaml", "-o", "json", "--name", config).stdout)
    assert document == planned["sharing_config"]
    assert {p["workload"] for p in planned["assignment"]} == {name}  # JSON keeps it exact

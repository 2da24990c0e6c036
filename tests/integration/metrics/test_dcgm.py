"""The dcgm-exporter-compatible families (metrics.dcgm-compat): every default counter of
dcgm-exporter's etc/default-counters.csv (committed, d5e5f51) is emitted with its name, type,
help and labels, or listed in the README with the reason; per GPU instance on MIG GPUs, with
the pod holding the device; promtool-clean."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from nodeagent.agent.service import Agent
from nodeagent.mig.config import parse_config
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.sim import SimulatedNvml, parse_spec
from nodeagent.state.snapshot import Holder
from tests.support.agent import SteppedClock, make_agent, make_settings
from tests.support.cli import Result
from tests.support.metrics import GIB, prometheus_tool, sample
from tests.support.mig_apply import reconfigure

ROOT = Path(__file__).resolve().parents[3]
CSV = ROOT / "tests/fixtures/upstream/dcgm-exporter/etc/default-counters.csv"
IDENTITY = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname"}
SERIES = re.compile(r"^(DCGM_FI_\w+)\{(.*)\} (\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
MIG_CONFIG = """\
version: v1
mig-configs:
  mixed:
    - devices: [0]
      mig-enabled: true
      mig-devices: {"3g.71gb": 1, "1g.18gb": 2}
    - devices: [1]
      mig-enabled: false
"""


def default_counters() -> list[tuple[str, str, str]]:
    """(field, type, help) of every row of the committed csv that is not a comment."""
    rows = []
    for line in CSV.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            field, kind, text = (part.strip() for part in line.split(",", 2))
            rows.append((field, kind, text))
    return rows


def readme_not_emitted() -> set[str]:
    """The DCGM fields the README's dcgm-exporter section lists as not emitted."""
    text = (ROOT / "docs" / "metrics.md").read_text()
    section = text.split("### dcgm-exporter compatibility", 1)[1].split("\n### ", 1)[0]
    listed = section.split("Not emitted", 1)[1]
    return set(re.findall(r"^\| `(DCGM_FI_\w+)` \|", listed, re.M))


def build(
    spec: str, config: str | None, holders: Mapping[str, Holder] | None = None
) -> tuple[Agent, SimulatedNvml, NvmlSession]:
    lib = SimulatedNvml(parse_spec(spec))
    session = NvmlSession(lib)
    if config:
        reconfigure(session, parse_config(config, "mixed.yaml"), "mixed", lib.reset)
    agent = make_agent(
        session,
        lib.reset,
        allocations=(lambda: dict(holders)) if holders is not None else None,
        monotonic=SteppedClock(),
        metrics={"dcgm_compat": True},
        kube={"node_name": "node-a"},
    )
    return agent, lib, session


def scrape(agent: Agent) -> str:
    agent.exposition.changed()
    return agent.exposition.latest().decode()


def dcgm_series(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{family: [(labels, value)]} of the DCGM_FI_* series of an exposition (read by hand:
    prometheus_client's parser renames counters without `_total`)."""
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        match = SERIES.match(line)
        if match:
            labels = {k: v.replace('\\"', '"') for k, v in LABEL.findall(match[2])}
            found.setdefault(match[1], []).append((labels, float(match[3])))
    return found


def type_and_help(text: str) -> dict[str, tuple[str, str]]:
    helps = dict(re.findall(r"^# HELP (DCGM_FI_\w+) (.*)$", text, re.M))
    types = dict(re.findall(r"^# TYPE (DCGM_FI_\w+) (\w+)$", text, re.M))
    return {name: (types[name], helps[name]) for name in types}


@pytest.fixture(scope="module")
def whole_gpu() -> tuple[str, dict[str, list[tuple[dict[str, str], float]]]]:
    """An H200 with a loaded process, read twice (PCIe rates need two reads)."""
    agent, lib, _ = build("h200", None)
    lib.attach("0", 700, 10 * GIB, 0.6)
    sample(agent)
    agent.monotonic.offset += 5.0  # type: ignore[attr-defined]
    sample(agent)
    text = scrape(agent)
    agent.stop()
    return text, dcgm_series(text)


@pytest.mark.parametrize("field,kind,text", default_counters())
def test_every_default_counter_is_emitted_or_listed(
    whole_gpu: tuple[str, dict[str, list[tuple[dict[str, str], float]]]],
    field: str,
    kind: str,
    text: str,
) -> None:
    exposition, series = whole_gpu
    listed = readme_not_emitted()
    if kind == "label":
        assert series and all(labels.get(field) == "580.159.04" for s in series.values()
                              for labels, _ in s), field  # fmt: skip
        return
    if field in listed:
        assert field not in series, f"{field} is listed as not emitted but is emitted"
        return
    assert field in series, f"{field}: neither emitted nor listed in the README"
    assert type_and_help(exposition)[field] == (kind, text)
    for labels, _ in series[field]:
        extra = {"DCGM_FI_DRIVER_VERSION", "err_code", "err_msg"}
        assert set(labels) - extra == IDENTITY
        assert labels["device"] == "nvidia0" and labels["hostname"] == "node-a"


@pytest.mark.parametrize(
    "field,expected",
    [
        ("DCGM_FI_DEV_GPU_UTIL", 60.0),  # the process's load, in %
        ("DCGM_FI_DEV_ENC_UTIL", 0.0),  # no video work
        ("DCGM_FI_DEV_FB_RESERVED", 615.0),  # the H200's 644939776 reserved bytes, in MiB
        ("DCGM_FI_DEV_FB_USED", 10240.0),  # the process's 10 GiB, the reserved apart
        ("DCGM_FI_DEV_GPU_TEMP", 52.0),  # idle 30 C + 0.6 load x (66 - 30)
        ("DCGM_FI_DEV_MEMORY_TEMP", 58.0),  # the HBM 6 C above the GPU
        ("DCGM_FI_DEV_XID_ERRORS", 0.0),
    ],
)
def test_values_of_a_whole_gpu(
    whole_gpu: tuple[str, dict[str, list[tuple[dict[str, str], float]]]],
    field: str,
    expected: float,
) -> None:
    (_, value), = whole_gpu[1][field]  # fmt: skip
    assert value == expected


def test_rates_and_ratios_are_sane(
    whole_gpu: tuple[str, dict[str, list[tuple[dict[str, str], float]]]],
) -> None:
    series = whole_gpu[1]
    for field in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"):
        assert 0.5 < series[field][0][1] <= 1.0  # ratios, not percent
    tx, rx = series["DCGM_FI_PROF_PCIE_TX_BYTES"][0][1], series["DCGM_FI_PROF_PCIE_RX_BYTES"][0][1]
    assert 0 < tx < rx < 1e9


def test_mig_gpu_series_are_per_gpu_instance_with_the_holding_pod() -> None:
    lib = SimulatedNvml(parse_spec("h200x2"))
    session = NvmlSession(lib)
    reconfigure(session, parse_config(MIG_CONFIG, "mixed.yaml"), "mixed", lib.reset)
    gpus = read_inventory(session).gpus
    three = next(s for s in gpus[0].slices if s.profile == "3g.71gb")
    assert three.mig_uuid is not None
    lib.attach(three.mig_uuid, 701, 4 * GIB, 1.0)
    holders = {
        f"{three.mig_uuid}::2": Holder("ml", "asr-0", "server"),
        gpus[1].uuid: Holder("ml", "llm-0", "vllm"),
        "GPU-00000000-0000-0000-0000-000000000000": Holder("ml", "ghost", "x"),
    }
    agent = make_agent(session, lib.reset, allocations=lambda: holders,
                       monotonic=SteppedClock(), metrics={"dcgm_compat": True})  # fmt: skip
    sample(agent)
    series = dcgm_series(scrape(agent))
    agent.stop()
    mig = [labels for labels, _ in series["DCGM_FI_DEV_GPU_TEMP"] if labels["gpu"] == "0"]
    assert sorted((m["GPU_I_PROFILE"], m["GPU_I_ID"]) for m in mig) == sorted(
        (s.profile, str(s.gi_id)) for s in gpus[0].slices
    )
    held = [m for m in mig if m.get("pod")]
    assert [(m["GPU_I_ID"], m["namespace"], m["pod"], m["container"]) for m in held] == [
        (str(three.gi_id), "ml", "asr-0", "server")
    ]
    whole = [labels for labels, _ in series["DCGM_FI_DEV_GPU_TEMP"] if labels["gpu"] == "1"]
    assert [(w.get("GPU_I_ID"), w["pod"]) for w in whole] == [(None, "llm-0")]
    # Whole-GPU-only values have no GPU-instance series; the GI's own values are its own.
    assert {labels["gpu"] for labels, _ in series["DCGM_FI_DEV_GPU_UTIL"]} == {"1"}
    fb = {labels.get("GPU_I_ID"): v for labels, v in series["DCGM_FI_DEV_FB_USED"]}
    assert fb[str(three.gi_id)] == 4096.0
    active = {labels.get("GPU_I_ID"): v for labels, v in series["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]}
    assert active[str(three.gi_id)] > 0.9 and all(
        v == 0.0 for gi, v in active.items() if gi not in (str(three.gi_id), None)
    )


def test_last_xid_names_its_code() -> None:
    agent, lib, _ = build("h200", None)
    sample(agent)  # the XID watch starts with the first read
    lib.inject_xid(0, 79)
    sample(agent)
    (labels, value), = dcgm_series(scrape(agent))["DCGM_FI_DEV_XID_ERRORS"]  # fmt: skip
    agent.stop()
    assert value == 79
    assert (labels["err_code"], labels["err_msg"]) == ("79", "GPU has fallen off the bus")


def test_off_by_default_and_on_with_a_reload() -> None:
    lib = SimulatedNvml(parse_spec("h200"))
    session = NvmlSession(lib)
    agent = make_agent(session, lib.reset, monotonic=SteppedClock())
    sample(agent)
    off = scrape(agent)
    assert agent.reload(make_settings(agent.settings, metrics={"dcgm_compat": True})) == []
    on = scrape(agent)
    agent.stop()
    assert "nodeagent_gpu_info" in off and "DCGM_FI_" not in off
    assert "nodeagent_gpu_info" in on and "DCGM_FI_DEV_GPU_TEMP{" in on


# What promtool's lint says of dcgm-exporter's own names (its camelCase labels, its counters
# without `_total`): the price of compatibility, and all it may say.
UPSTREAM_LINT = re.compile(
    r"^DCGM_FI_\w+ (label names should be written in 'snake_case' not 'camelCase'"
    r"|counter metrics should have \"_total\" suffix"
    r"|metric name should not include type 'counter')$"
)


@pytest.mark.parametrize("spec,config", [("h200", None), ("h200x2", MIG_CONFIG), ("a30", None)])
def test_promtool_finds_nothing_but_dcgm_exporters_own_names(spec: str, config: str | None) -> None:
    agent, _, _ = build(spec, config)
    sample(agent)
    text = scrape(agent)
    agent.stop()
    assert "DCGM_FI_DEV_GPU_TEMP" in text
    proc = subprocess.run(
        [prometheus_tool("promtool"), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    findings = (proc.stdout + proc.stderr).splitlines()
    assert findings, "expected promtool to flag dcgm-exporter's camelCase labels"
    assert [f for f in findings if not UPSTREAM_LINT.match(f)] == []


def test_the_metrics_command_names_the_node_as_run_does(cli: Callable[..., Result]) -> None:
    """`nodeagent metrics --dcgm-compat` takes the node's name from NODE_NAME (the downward
    API), as `run` does, for dcgm-exporter's `hostname` label."""
    res = cli("--simulate", "h200", "metrics", "--dcgm-compat", env={"NODE_NAME": "gpu-node-7"})
    assert res.returncode == 0, res.stderr
    hostnames = set(re.findall(r'hostname="([^"]*)"', res.stdout))
    assert hostnames == {"gpu-node-7"}

"""Bad input to the DRA driver: settings, claims' opaque configs, a checkpoint it cannot read.
Each is one sentence naming what is wrong; nothing is guessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.dra.checkpoint import PREPARED, Checkpoint, PreparedClaim, PreparedDevice, load, save
from nodeagent.dra.claims import Mps, claimed_devices, parse_quantity, quoted
from nodeagent.dra.devices import DeviceRef
from nodeagent.settings import load as load_settings
from nodeagent.state.record import Owners

DRIVER = "gpu.nodeagent.io"


@pytest.mark.parametrize(
    ("environ", "error"),
    [
        ({"NODEAGENT_DRA": "true"}, "--dra needs --kube"),
        (
            {"NODEAGENT_DRA_DRIVER": "Gpu_Driver"},
            "environment variable NODEAGENT_DRA_DRIVER: must be a DNS subdomain",
        ),
        ({"NODEAGENT_DRA_DRIVER": "nodots"}, "must be a DNS subdomain"),
        ({"NODEAGENT_DRA_DRIVER": "a" * 61 + ".io"}, "at most 63 characters"),
        ({"NODEAGENT_DRA_DEVICES": "0,x"}, "NODEAGENT_DRA_DEVICES"),
    ],
)
def test_bad_settings_are_one_sentence(environ: dict[str, str], error: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(environ=environ)
    assert error in str(info.value)


def test_settings_defaults_and_values() -> None:
    s, _ = load_settings(
        environ={"NODEAGENT_KUBE": "true", "NODE_NAME": "n", "NODEAGENT_DRA": "true"}
    )
    assert s.dra.enabled and s.dra.driver == DRIVER
    assert s.dra.plugin_path == Path("/var/lib/kubelet/plugins/gpu.nodeagent.io")
    s, _ = load_settings(environ={"NODEAGENT_DRA_DEVICES": "4,5", "NODEAGENT_DRA_DRIVER": "g.x.io"})
    assert s.dra.devices == (4, 5) and s.dra.plugin_path == Path("/var/lib/kubelet/plugins/g.x.io")


def claim(device: str, config: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    results = [{"request": "gpu", "driver": DRIVER, "pool": "n", "device": device}]
    allocation = {"devices": {"results": results, "config": config or []}}
    return {
        "metadata": {"namespace": "ns", "name": "c"},
        "status": status.get("status", {"allocation": allocation}),
    }


def mps(params: dict[str, Any], **entry: Any) -> list[dict[str, Any]]:
    full = {"apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsConfig", **params}
    return [{"opaque": {"driver": DRIVER, "parameters": full}, **entry}]


@pytest.mark.parametrize(
    ("obj", "error"),
    [
        (claim("gpu-0", status={}), "claim ns/c is not allocated"),
        (claim("cpu-0"), "device 'cpu-0' is not one gpu.nodeagent.io publishes"),
        (
            claim("gpu-0", mps({"threadPercentage": 0})),
            "threadPercentage must be a whole number 1-100, not 0",
        ),
        (claim("gpu-0", mps({"threadPercentage": True})), "not True"),
        (
            claim("gpu-0", mps({"threadPercentage": 25, "pinnedMemory": "512"})),
            "pinnedMemory must be at least 1Mi",
        ),
        (claim("gpu-0", mps({"threadPercentage": 25, "pinned": "1Gi"})), "unknown key 'pinned'"),
        (
            claim("gpu-0-mig-1g18gb-19-0", mps({"threadPercentage": 25})),
            "an MPS share needs a whole GPU",
        ),
    ],
)
def test_bad_claims_name_the_claim(obj: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError) as info:
        claimed_devices(obj, DRIVER, "n")
    assert str(info.value).startswith("claim ns/c")
    assert error in str(info.value)


def test_the_claims_config_wins_over_the_class_and_requests_select() -> None:
    config = [
        *mps({"threadPercentage": 50}, source="FromClass"),
        *mps({"threadPercentage": 25, "pinnedMemory": "8Gi"}, source="FromClaim"),
        *mps({"threadPercentage": 10}, source="FromClaim", requests=["other"]),
    ]
    (device,) = claimed_devices(claim("gpu-3", config), DRIVER, "n")
    assert device.ref == DeviceRef(3)
    assert device.mps == Mps(25, 8 << 30)
    other_driver = [{"opaque": {"driver": "gpu.nvidia.com", "parameters": {"x": 1}}}]
    assert claimed_devices(claim("gpu-3", other_driver), DRIVER, "n")[0].mps is None
    with pytest.raises(ConfigError, match=r"has no device of gpu\.nodeagent\.io on node m"):
        claimed_devices(claim("gpu-3"), DRIVER, "m")


@pytest.mark.parametrize(
    ("text", "size"),
    [("16Gi", 16 << 30), ("500M", 500 * 10**6), ("1048576", 1 << 20), ("2Ti", 2 << 40)],
)
def test_quantities(text: str, size: int) -> None:
    assert parse_quantity(text, "x") == size


def _claim_text(
    gpu: str = "0",
    start: str = "2",
    device: str = "{}",
    state: str = '"prepared"',
    mps: str = "null",
) -> str:
    """A checkpoint of one claim on a 1g.18gb slice, with one value replaced (JSON text)."""
    dev = (
        f'{{"request": "gpu", "pool": "n", "device": "gpu-0-mig-1g18gb-19-2", "gpu": {gpu},'
        f' "gpu_uuid": "GPU-1", "profile_id": 19, "profile": "1g.18gb",'
        f' "placement_start": {start}, "placement_size": 1, "mps": {mps}}}'
    )
    devices = f"[{dev}]" if device == "{}" else device
    claim = f'{{"namespace": "ns", "name": "c", "state": {state}, "devices": {devices},'
    return f'{{"version": 1, "claims": {{"u": {claim} "cdi_ids": ["id"]}}}}}}'


def test_the_claim_text_helper_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(_claim_text())
    assert load(path).claims["u"].devices[0].placement_start == 2


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("{", "is not JSON"),
        ('{"version": 3, "claims": {}}', "is not a version 2 checkpoint"),
        ('{"version": 1, "claims": []}', "'claims' is not a mapping"),
        ('{"version": 1, "claims": {"u": {"namespace": "n"}}}', "claim u is malformed"),
        ('{"version": 1, "claims": {"u": [1, 2]}}', "claim u is malformed"),
        ('{"version": 1, "claims": {"u": null}}', "claim u is malformed"),
        (_claim_text(gpu='"0"'), r"claim u is malformed \(gpu is '0'\)"),
        (_claim_text(gpu="true"), r"claim u is malformed \(gpu is True\)"),
        (_claim_text(start='"x"'), r"claim u is malformed \(placement_start is 'x'\)"),
        (_claim_text(device='["x"]'), "claim u is malformed"),
        (_claim_text(state='"done"'), r"claim u is malformed \(state is 'done'"),
        (_claim_text(mps="[1]"), r"claim u is malformed \(mps is \[1\]\)"),
    ],
)
def test_a_checkpoint_it_cannot_read_is_an_error(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=error):
        load(path)


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    device = PreparedDevice("gpu", "n", "gpu-0-mig-1g18gb-19-2", 0, "GPU-1", 19, "1g.18gb", 2, 1)
    cp = Checkpoint({"u": PreparedClaim("ns", "c", PREPARED, (device,), ("id",))})
    save(tmp_path / "c.json", cp)
    assert load(tmp_path / "c.json") == cp
    assert load(tmp_path / "missing.json") == Checkpoint()
    # Who holds a slice is the ownership record's to say (the checkpoint is its view).
    record = Owners(cp.claims)
    assert record.owner_of("GPU-1", 2, 1) == "claim ns/c"
    assert (
        record.owner_of("GPU-1", 3, 4) is None and record.owner_of("GPU-1", 2, 1, but="u") is None
    )


LONG = "1" * 5000  # int() of it fails: Python's limit on converting long digit strings


@pytest.mark.parametrize(
    "device",
    ["gpu-\u0660", "gpu-\u0660-mps", "gpu-0-mps\n", "gpu-0\n", "gpu-00", "gpu-00-mps", "gpu-²",
     f"gpu-{LONG}", "gpu-0-mig-1g18gb-١٩-0", "gpu-0-mig-1g18gb-19-0\n", f"gpu-0-mig-1g-19-{LONG}"],
)  # fmt: skip
def test_a_device_name_is_read_as_this_driver_writes_it(device: str) -> None:
    """ASCII digits without a leading zero, nothing after: 'gpu-\u0660-mps' or 'gpu-0-mps\\n' would
    be GPU 0's share device under another name (another MPS daemon's key)."""
    with pytest.raises(ConfigError) as info:
        claimed_devices(claim(device), DRIVER, "n")
    assert str(info.value) == f"claim ns/c: device {quoted(device)} is not one {DRIVER} publishes"


def share_claim(sm: object, memory: object) -> dict[str, Any]:
    obj = claim("gpu-0-mps")
    (result,) = obj["status"]["allocation"]["devices"]["results"]
    result["consumedCapacity"] = {f"{DRIVER}/sm": sm, f"{DRIVER}/memory": memory}
    return obj


@pytest.mark.parametrize(
    ("sm", "memory", "words"),
    [
        ("²", "8Gi", "sm '²' is not a whole percentage 1-100"),
        ("٢٠", "8Gi", "sm '٢٠' is not a whole percentage 1-100"),
        ("20\n", "8Gi", "sm '20\\n' is not a whole percentage 1-100"),
        (LONG, "8Gi", "sm '11111111111111111111111111111111111111111111111111111111111111…"
                      " is not a whole percentage 1-100"),
        ("0100", "8Gi", "sm '0100' is not a whole percentage 1-100"),
        ("20", "٨Gi", "memory '٨Gi' is not a quantity of bytes like 16Gi or 500M"),
        ("20", "²Gi", "memory '²Gi' is not a quantity of bytes like 16Gi or 500M"),
        ("20", "8Gi\n", "memory '8Gi\\n' is not a quantity of bytes like 16Gi or 500M"),
        ("20", LONG + "Gi", "memory '111111111111111111111111111111111111111111111111111111111111"),
    ],
)  # fmt: skip
def test_consumed_capacity_is_ascii_digits_of_a_bounded_count(
    sm: object, memory: object, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        claimed_devices(share_claim(sm, memory), DRIVER, "n")
    text = str(info.value)
    assert text.startswith("claim ns/c: gpu-0-mps's consumed capacity: ")
    assert words in text and len(text) < 300


def test_consumed_capacity_as_the_scheduler_writes_it() -> None:
    (device,) = claimed_devices(share_claim("20", "8Gi"), DRIVER, "n")
    # the request as the scheduler wrote it; the limit the node's default (100), normal priority
    assert device.mps == Mps(20, 8 << 30, sm_limit_percent=100, priority="normal")

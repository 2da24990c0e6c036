"""The claims' CDI specs against the CDI schema (cncf-tags/container-device-interface@05ae4b5
schema/schema.json, defs.json) and its naming rules (pkg/parser/parser.go ValidateDeviceName,
pkg/cdi/spec.go GenerateTransientSpecName)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from nodeagent.dra import cdi
from nodeagent.dra.checkpoint import PreparedDevice

SCHEMA = Path(__file__).resolve().parents[2] / "fixtures/upstream/container-device-interface/schema"
DEVICE_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
VENDOR = re.compile(r"^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
CLAIM_UID = "0f4b6a3e-8f53-4c1e-9a57-3c1d2b0b9e11"
MIG = PreparedDevice("slice", "n", "gpu-0-mig-1g18gb-19-3", 0, "GPU-a", 19, "1g.18gb", 3, 1,
                     mig_uuid="MIG-b")  # fmt: skip
MPS = PreparedDevice("gpu", "n", "gpu-1", 1, "GPU-c",
                     mps={"thread_percentage": 25, "pinned_memory_bytes": 16 << 30,
                          "pipe_dir": "/var/lib/kubelet/plugins/g/mps/u/gpu-1/pipe"})  # fmt: skip


def validator() -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMA / "schema.json").read_text())
    defs = json.loads((SCHEMA / "defs.json").read_text())
    registry = Registry().with_resource("defs.json", Resource.from_contents(defs, DRAFT7))
    return jsonschema.Draft7Validator(schema, registry=registry)


@pytest.mark.parametrize("devices", [[MIG], [MPS], [MIG, MPS]], ids=["mig", "mps", "both"])
def test_specs_follow_the_cdi_schema_and_names(devices: list[PreparedDevice]) -> None:
    spec = cdi.render("gpu.nodeagent.io", CLAIM_UID, devices)
    validator().validate(spec)
    vendor, cls = spec["kind"].split("/")
    assert VENDOR.match(vendor) and cls == "claim"
    for device in spec["devices"]:
        assert DEVICE_NAME.match(device["name"]), device["name"]
    assert cdi.spec_file(Path("/var/run/cdi"), "gpu.nodeagent.io", CLAIM_UID).name == (
        f"k8s.gpu.nodeagent.io-claim_{CLAIM_UID}.json"
    )


def test_a_spec_missing_its_edits_is_refused_by_the_schema() -> None:
    """The check above can fail."""
    spec = cdi.render("gpu.nodeagent.io", CLAIM_UID, [MIG])
    del spec["devices"][0]["containerEdits"]
    with pytest.raises(jsonschema.ValidationError, match="containerEdits"):
        validator().validate(spec)


def test_edits_select_the_device_and_point_at_the_claims_mps_daemon() -> None:
    spec = cdi.render("gpu.nodeagent.io", CLAIM_UID, [MIG, MPS])
    mig, mps = (d["containerEdits"] for d in spec["devices"])
    assert mig == {"env": ["NVIDIA_VISIBLE_DEVICES=MIG-b"]}
    pipe = "/var/lib/kubelet/plugins/g/mps/u/gpu-1/pipe"
    assert mps["env"] == [
        "NVIDIA_VISIBLE_DEVICES=GPU-c",
        f"CUDA_MPS_PIPE_DIRECTORY={pipe}",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16384M",
    ]
    assert mps["mounts"] == [{"hostPath": pipe, "containerPath": pipe, "options": ["rbind", "rw"]}]

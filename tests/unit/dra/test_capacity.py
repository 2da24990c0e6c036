"""MPS shares as consumable capacity (KEP-5075): the share devices nodeagent publishes beside
its GPUs and MIG placements, and the MPS limits a claim gets from its allocation's
consumedCapacity. Field names as resource.k8s.io/v1 has them in Kubernetes v1.36
(kubernetes/api resource/v1/types.go: Device.allowMultipleAllocations, DeviceCapacity.
requestPolicy, DeviceRequestAllocationResult.consumedCapacity and shareID)."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.dra.capacity import binary_quantity
from nodeagent.dra.claims import Mps, claimed_devices, share_mps
from nodeagent.dra.devices import DeviceRef, parse_device_name, resource_slices
from nodeagent.state.owners import Owners
from tests.support.records import held, owned
from tests.unit.dra.test_devices import DRIVER, inventory, validate_slices

SM, MEMORY = f"{DRIVER}/sm", f"{DRIVER}/memory"


def _devices(spec: str, shares: str, mig: bool = False) -> dict[str, dict[str, Any]]:
    slices = resource_slices(inventory(spec, mig), "n", DRIVER, shares=shares)
    return {d["name"]: d for s in slices for d in s.spec.get("devices", [])}


def _counter_sets(spec: str, shares: str, mig: bool = False) -> list[dict[str, Any]]:
    slices = resource_slices(inventory(spec, mig), "n", DRIVER, shares=shares)
    return [c for s in slices for c in s.spec.get("sharedCounters", [])]


def test_no_shares_publishes_what_it_did() -> None:
    assert not [n for n in _devices("h200", "none") if n.endswith("-mps")]
    assert resource_slices(inventory("h200"), "n", DRIVER) == resource_slices(
        inventory("h200"), "n", DRIVER, shares="none"
    )


def test_a_gpu_share_is_multi_allocatable_with_two_capacities_and_its_twins_counters() -> None:
    devices = _devices("h200", "gpus")
    share, whole = devices["gpu-0-mps"], devices["gpu-0"]
    assert share["allowMultipleAllocations"] is True
    assert share["attributes"]["type"] == {"string": "mps"}
    assert share["attributes"]["shareOf"] == {"string": "gpu"}
    assert share["attributes"]["uuid"] == whole["attributes"]["uuid"]
    # Every capacity of a multi-allocatable device is consumed by each allocation: none but
    # the two a share is sized by.
    assert share["capacity"] == {
        SM: {
            "value": "100",
            "requestPolicy": {
                "default": "25",
                "validRange": {"min": "5", "max": "100", "step": "5"},
            },
        },
        MEMORY: {
            "value": "143771Mi",
            "requestPolicy": {"default": "35942Mi", "validRange": {"min": "1Mi", "step": "1Mi"}},
        },
    }
    assert share["consumesCounters"] == whole["consumesCounters"]
    assert not [n for n in devices if n.endswith("-mps") and n != "gpu-0-mps"]  # no MIG shares


def test_a_gpu_without_slices_gets_a_counter_set_that_keeps_it_and_its_share_apart() -> None:
    assert _counter_sets("a100-40gb", "none") == []
    (counters,) = _counter_sets("a100-40gb", "gpus")
    memory = inventory("a100-40gb").gpus[0].memory_total_bytes
    assert counters == {"name": "gpu-0-counter-set", "counters": {"memory": {"value": str(memory)}}}
    devices = _devices("a100-40gb", "gpus")
    want = [{"counterSet": "gpu-0-counter-set", "counters": {"memory": {"value": str(memory)}}}]
    assert devices["gpu-0"]["consumesCounters"] == want == devices["gpu-0-mps"]["consumesCounters"]


def test_mig_shares_twin_every_placement_within_the_slice_limit() -> None:
    devices = _devices("h200", "mig")
    placements = [n for n in devices if "-mig-" in n and not n.endswith("-mps")]
    assert len(placements) == 25
    for name in placements:
        share = devices[name + "-mps"]
        assert share["consumesCounters"] == devices[name]["consumesCounters"]
        assert share["attributes"]["shareOf"] == {"string": "mig"}
        assert share["attributes"]["profile"] == devices[name]["attributes"]["profile"]
        memory = int(devices[name]["capacity"]["memory"]["value"])
        assert share["capacity"][MEMORY]["value"] == binary_quantity(memory >> 20 << 20)
    assert len(devices) == 52 <= 64  # one devices slice still holds the GPU
    # An Ampere GPU with MIG on offers no whole GPU: no whole share either.
    a100 = _devices("a100-40gb", "mig", mig=True)
    assert "gpu-0-mps" not in a100 and len([n for n in a100 if n.endswith("-mps")]) == 25


@pytest.mark.parametrize(("spec", "mig"), [("h200x2", False), ("a100-40gb", False), ("a30", True)])
def test_share_slices_validate_against_the_v1_schema(spec: str, mig: bool) -> None:
    validate_slices(resource_slices(inventory(spec, mig), "node-1", DRIVER, shares="mig"))


@pytest.mark.parametrize(
    ("name", "ref"),
    [
        ("gpu-3-mps", DeviceRef(3, shared=True)),
        ("gpu-3", DeviceRef(3)),
        ("gpu-0-mig-1g18gb-19-6-mps", DeviceRef(0, 19, 6, shared=True)),
        ("gpu-0-mig-1g18gb-19-6", DeviceRef(0, 19, 6)),
        ("gpu-0-mps-mps", None),
        ("gpu-0-mig-1g18gb-19-6-mps-1", None),
    ],
)
def test_share_names_parse_back(name: str, ref: DeviceRef | None) -> None:
    assert parse_device_name(name) == ref


@pytest.mark.parametrize(
    ("n", "text"),
    [(1 << 30, "1Gi"), (1536 << 20, "1536Mi"), (143771 << 20, "143771Mi"), (17, "17"), (0, "0")],
)
def test_binary_quantities_are_written_as_the_api_server_writes_them_back(
    n: int, text: str
) -> None:
    assert binary_quantity(n) == text


# -- the capacity -> limits mapping -------------------------------------------------------------


@pytest.mark.parametrize(
    ("consumed", "mps"),
    [
        ({SM: "30", MEMORY: "16Gi"}, Mps(30, 16 << 30)),
        ({SM: "30", MEMORY: "17179869184"}, Mps(30, 16 << 30)),
        ({SM: "100", MEMORY: "143771Mi"}, Mps(100, 143771 << 20)),
        ({SM: "5", MEMORY: "1Mi"}, Mps(5, 1 << 20)),
        ({SM: "25", MEMORY: "1G"}, Mps(25, 10**9 >> 20 << 20)),  # whole MiB, as the daemon takes
    ],
)
def test_consumed_capacity_becomes_the_claims_mps_limits(
    consumed: dict[str, str], mps: Mps
) -> None:
    result = {"device": "gpu-0-mps", "consumedCapacity": consumed}
    assert share_mps(result, DRIVER, "claim a/b") == mps


@pytest.mark.parametrize(
    ("consumed", "said"),
    [
        (None, "is the DRAConsumableCapacity feature gate off"),
        ({SM: "30"}, "is the DRAConsumableCapacity feature gate off"),
        ({SM: "0", MEMORY: "1Gi"}, "sm '0' is not a whole percentage 1-100"),
        ({SM: "101", MEMORY: "1Gi"}, "sm '101' is not a whole percentage 1-100"),
        ({SM: "300m", MEMORY: "1Gi"}, "sm '300m' is not a whole percentage 1-100"),
        ({SM: "30", MEMORY: "512Ki"}, "memory '512Ki' is under 1Mi"),
        ({SM: "30", MEMORY: "1.5Gi"}, "memory '1.5Gi' is not a quantity of bytes"),
    ],
)
def test_a_bad_consumed_capacity_is_refused_naming_it(
    consumed: dict[str, str] | None, said: str
) -> None:
    result = {"device": "gpu-0-mps", "consumedCapacity": consumed}
    with pytest.raises(ConfigError, match="claim a/b: ") as err:
        share_mps(result, DRIVER, "claim a/b")
    assert said in str(err.value)


def _claim(device: str, config: bool = False, admin: bool = False) -> dict[str, Any]:
    result: dict[str, Any] = {
        "request": "share", "driver": DRIVER, "pool": "n", "device": device,
        "shareID": "51c8227b-e764-44f8-93c7-a543b6b4d047",
        "consumedCapacity": {SM: "30", MEMORY: "16Gi"},
    }  # fmt: skip
    if admin:
        result["adminAccess"] = True
    configs = [
        {"source": "FromClaim", "requests": ["share"], "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsConfig", "threadPercentage": 50}}}
    ]  # fmt: skip
    devices = {"results": [result], "config": configs if config else []}
    return {"metadata": {"namespace": "a", "name": "b"}, "status": {"allocation": {"devices": devices}}}  # fmt: skip


@pytest.mark.parametrize("device", ["gpu-0-mps", "gpu-0-mig-1g18gb-19-6-mps"])
def test_a_share_devices_claim_carries_its_limits_and_share_id(device: str) -> None:
    (claimed,) = claimed_devices(_claim(device), DRIVER, "n")
    # The request is what the scheduler counted; no smLimit anywhere: the node's default, 100.
    assert claimed.mps == Mps(30, 16 << 30, None, 100, "normal")
    assert claimed.share_id == "51c8227b-e764-44f8-93c7-a543b6b4d047"
    assert claimed.ref.shared


def test_one_claim_given_one_share_device_twice_is_refused() -> None:
    claim = _claim("gpu-0-mps")
    results = claim["status"]["allocation"]["devices"]["results"]
    results.append({**results[0], "request": "other", "shareID": "another"})
    with pytest.raises(ConfigError, match="gpu-0-mps is given to two of its requests"):
        claimed_devices(claim, DRIVER, "n")


def test_a_share_takes_no_mps_config_and_admin_access_no_limits() -> None:
    with pytest.raises(ConfigError, match="gpu-0-mps is an MPS share sized by the scheduler"):
        claimed_devices(_claim("gpu-0-mps", config=True), DRIVER, "n")
    (admin,) = claimed_devices(_claim("gpu-0-mps", admin=True), DRIVER, "n")
    assert admin.mps is None and admin.admin
    # The MpsConfig path of a whole GPU is as it was.
    (whole,) = claimed_devices(_claim("gpu-0", config=True), DRIVER, "n")
    assert whole.mps == Mps(50, None) and not whole.ref.shared


def test_shares_of_one_device_coexist_in_the_ownership_record_an_exclusive_holder_does_not() -> (
    None
):
    share = held("GPU-a", shared=True)
    slice_share = held("GPU-a", 6, 1, 19, shared=True)
    owners = Owners(
        {
            "u1": owned("ns", "one", (share,)),
            "u2": owned("ns", "two", (held("GPU-b"),)),
            "u3": owned("ns", "three", (held("GPU-c", 6, 1, 19, shared=True),)),
        }
    )
    assert owners.owner_of("GPU-a", 0, 8, but="u9", share=share) is None  # another share
    assert owners.owner_of("GPU-a", 0, 8, but="u9") == "claim ns/one"  # the whole GPU
    assert owners.owner_of("GPU-a", 6, 1, but="u9", share=slice_share) == "claim ns/one"
    assert (
        owners.owner_of("GPU-b", 0, 8, but="u9", share=held("GPU-b", shared=True)) == "claim ns/two"
    )
    assert (
        owners.owner_of("GPU-c", 6, 1, but="u9", share=held("GPU-c", 6, 1, 19, shared=True)) is None
    )
    assert (
        owners.owner_of("GPU-c", 6, 1, but="u9", share=held("GPU-c", 6, 1, 20, shared=True))
        == "claim ns/three"
    )
    assert owners.sharing(share, but="u9") == ["claim ns/one"]
    assert owners.sharing(share, but="u1") == []


def test_the_share_device_docs_dra_md_shows_is_what_an_h200_publishes() -> None:
    from tests.deploy.dra.test_dra_examples import readme_documents

    (shown,) = [
        d for doc in readme_documents() if doc["kind"] == "ResourceSlice" for d in doc["spec"]["devices"]
    ]  # fmt: skip
    published = _devices("h200", "gpus")[shown["name"]]
    assert shown["capacity"] == published["capacity"]
    assert shown["allowMultipleAllocations"] is published["allowMultipleAllocations"] is True
    for name, value in shown["attributes"].items():
        if name != "uuid":  # the emulator's UUIDs are its own
            assert published["attributes"][name] == value
    (counters,) = shown["consumesCounters"]
    (all_counters,) = published["consumesCounters"]
    assert counters["counters"].items() <= all_counters["counters"].items()


def _share_config(source: str, **params: Any) -> dict[str, Any]:
    return {"source": source, "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": "gpu.nodeagent.io/v1", "kind": "MpsShare", **params}}}  # fmt: skip


def _limited(*configs: dict[str, Any], default: int = 100) -> Mps | None:
    claim = _claim("gpu-0-mps")
    claim["status"]["allocation"]["devices"]["config"] = list(configs)
    (claimed,) = claimed_devices(claim, DRIVER, "n", default)
    return claimed.mps


@pytest.mark.parametrize(
    ("configs", "default", "limit", "priority", "user"),
    [
        ([], 100, 100, "normal", None),  # a request alone bursts into the idle GPU
        ([], 60, 60, "normal", None),  # the node's default
        ([], 20, 30, "normal", None),  # a node default below the request: the request
        ([_share_config("FromClass", smLimit=50)], 100, 50, "normal", None),
        # The claim's word over its class's, field by field.
        ([_share_config("FromClass", smLimit=50, priority="low"),
          _share_config("FromClaim", smLimit=70, user=1000)], 100, 70, "low", 1000),
        ([_share_config("FromClaim", smLimit=30)], 100, 30, "normal", None),  # limit = request
        ([_share_config("FromClaim", priority="low")], 80, 80, "low", None),
    ],
)  # fmt: skip
def test_a_shares_limit_comes_from_its_claim_then_its_class_then_the_node(
    configs: list[dict[str, Any]], default: int, limit: int, priority: str, user: int | None
) -> None:
    assert _limited(*configs, default=default) == Mps(30, 16 << 30, user, limit, priority)


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"smLimit": 20}, "gpu-0-mps: smLimit 20 is below the claim's request of 30 % of the SMs"),
        ({"smLimit": 101}, "smLimit must be a whole percentage 1-100, not 101"),
        ({"smLimit": "60"}, "smLimit must be a whole percentage 1-100, not '60'"),
        ({"smLimit": True}, "smLimit must be a whole percentage 1-100, not True"),
        ({"priority": "high"}, "priority must be normal or low, not 'high'"),
        ({"burst": 1}, "unknown key 'burst'"),
    ],
)
def test_a_bad_share_limit_is_refused_in_one_sentence(params: dict[str, Any], said: str) -> None:
    with pytest.raises(ConfigError) as err:
        _limited(_share_config("FromClaim", **params))
    assert said in str(err.value)
    assert str(err.value).startswith("claim a/b: ") and "\n" not in str(err.value)


def test_a_share_config_on_a_device_that_is_no_share_is_refused() -> None:
    claim = _claim("gpu-0")
    claim["status"]["allocation"]["devices"]["config"] = [_share_config("FromClaim", smLimit=50)]
    with pytest.raises(ConfigError, match="gpu-0 is not an MPS share device"):
        claimed_devices(claim, DRIVER, "n")


def test_a_class_limit_below_the_request_says_it_is_the_classs() -> None:
    """The sentence named no source: a claim with no MpsShare of its own was told its smLimit
    was too low."""
    with pytest.raises(ConfigError) as err:
        _limited(_share_config("FromClass", smLimit=20))
    assert str(err.value).endswith(
        "gpu-0-mps: the DeviceClass's MpsShare smLimit 20 is below the claim's request of 30 %"
        " of the SMs; a limit is between the request and 100"
    )
    with pytest.raises(ConfigError) as err:  # the claim's own word over its class's
        _limited(_share_config("FromClass", smLimit=50), _share_config("FromClaim", smLimit=20))
    assert "gpu-0-mps: smLimit 20 is below the claim's request" in str(err.value)
    # a class's limit under the claim's own: the limit said is the claim's
    with pytest.raises(ConfigError) as err:
        _limited(_share_config("FromClass", smLimit=20), _share_config("FromClaim", smLimit=25))
    assert "gpu-0-mps: smLimit 25 is below" in str(err.value)

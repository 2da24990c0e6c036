"""MPS shares as consumable capacity (KEP-5075, resource.k8s.io/v1, `DRAConsumableCapacity`):
what a share device offers, as the scheduler reads it. Pure.

A share device has `allowMultipleAllocations: true` and two capacities, each with a request
policy, that the scheduler hands out per allocation and writes into the allocation result as
`consumedCapacity` (with a `shareID` of its own): `<driver>/sm`, the percentage of the device's
SMs (the claim's request: its clients' MPS ceiling is its limit, nodeagent.dra.claims), and
`<driver>/memory`, bytes (its MPS pinned device memory limit). Every capacity of a
multi-allocatable device is consumed by each allocation (a capacity without a request policy
defaults to all of it), so a share device has no other capacity. nodeagent.dra.claims turns an
allocation's consumed capacity into limits.
"""

from __future__ import annotations

from typing import Any

SHARE_SUFFIX = "-mps"  # a share device is its twin's name plus this
SM_CAPACITY = "sm"  # percent of the device's SMs: a share's request (the scheduler counts it)
MEMORY_CAPACITY = "memory"  # bytes: a share's MPS pinned device memory limit
SM_DEFAULT_PERCENT = 25  # what a claim that names no capacity gets
SM_STEP_PERCENT = 5  # a request is rounded up to a multiple of this
_MIB = 1 << 20
_BINARY = (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10))


def binary_quantity(n: int) -> str:
    """`n` bytes as the API server writes a binary quantity back ('1Gi', '1536Mi', '17')."""
    for suffix, shift in _BINARY:
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{suffix}"
    return str(n)


def share_capacity(driver: str, memory_bytes: int) -> dict[str, dict[str, Any]]:
    """A share device's capacities: SMs in percent (min and step SM_STEP_PERCENT, default
    SM_DEFAULT_PERCENT) and memory in whole MiB (default: the default SM share of it)."""
    memory = memory_bytes // _MIB * _MIB
    default_memory = max(_MIB, memory * SM_DEFAULT_PERCENT // 100 // _MIB * _MIB)
    step = str(SM_STEP_PERCENT)
    return {
        f"{driver}/{SM_CAPACITY}": {
            "value": "100",
            "requestPolicy": {
                "default": str(SM_DEFAULT_PERCENT),
                "validRange": {"min": step, "max": "100", "step": step},
            },
        },
        f"{driver}/{MEMORY_CAPACITY}": {
            "value": binary_quantity(memory),
            "requestPolicy": {
                "default": binary_quantity(default_memory),
                "validRange": {"min": "1Mi", "step": "1Mi"},
            },
        },
    }


def share_device(twin: dict[str, Any], driver: str, memory_bytes: int) -> dict[str, Any]:
    """The MPS share device of a GPU or MIG device `twin`: its attributes (type `mps`,
    `shareOf` the twin's type), no capacity but the two a share consumes (every capacity of
    a multi-allocatable device is consumed by each allocation), its twin's counters."""
    attributes = {
        **twin["attributes"],
        "type": {"string": "mps"},
        "shareOf": twin["attributes"]["type"],  # gpu | mig: a selector tells them apart
    }
    device: dict[str, Any] = {
        "name": twin["name"] + SHARE_SUFFIX,
        "attributes": attributes,
        "capacity": share_capacity(driver, memory_bytes),
        "allowMultipleAllocations": True,
    }
    if twin.get("consumesCounters"):
        device["consumesCounters"] = twin["consumesCounters"]
    return device

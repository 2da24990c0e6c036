"""Binding conditions against a real API server (v1.36.2) with DRADeviceBindingConditions off:
it stores the ResourceSlices without them, silently; the driver sees that in the write's
answer, says it once, and publishes without them from then on, so the slices compare equal
and a later publish writes nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.nvml import MigWriter, read_inventory
from tests.k8s.test_gates_real import _plugin, _stored
from tests.support import leaks
from tests.support.cli import captured_logs
from tests.support.k8s import (
    DEFAULT_GATES,
    ControlPlane,
    k8s_available,
    make_node,
    required,
    shared_control_plane,
)


@pytest.fixture(scope="module")
def binding_off() -> ControlPlane:
    """A control plane of the session's own, DRADeviceBindingConditions and DRADeviceTaints off
    (shared by the xdist workers that run this module's tests; stopped at the session's end;
    port offset 25: apart from the shared plane's 0 and the other gate-off plane's 50)."""
    if not k8s_available():
        if required():
            pytest.fail("../shared/k8s is not beside this checkout (CI needs it)")
        pytest.skip("../shared/k8s is not beside this checkout: no real control plane")
    gates = DEFAULT_GATES.replace(
        "DRADeviceBindingConditions=true", "DRADeviceBindingConditions=false"
    ).replace("DRADeviceTaints=true", "DRADeviceTaints=false")
    try:
        return shared_control_plane(os.environ[leaks.MARKER], gates, 25, "binding-off")
    except RuntimeError as err:
        pytest.fail(str(err))


def test_dropped_binding_conditions_are_seen_said_once_and_left_out(
    binding_off: ControlPlane, short_tmp: Path
) -> None:
    from kubernetes import config

    api = config.new_client_from_config(str(binding_off.kubeconfig))
    make_node(api, "n-binding-off")
    plugin, session = _plugin(short_tmp, binding_off, "n-binding-off", "h200")
    MigWriter(session).set_mig_mode(0, True)
    try:
        with captured_logs("warning") as logs:
            assert plugin.publish(read_inventory(session)) is True
        assert plugin.publisher.binding_dropped is True
        said = [e for e in logs if e["event"] == "dra.binding_conditions_dropped"]
        assert len(said) == 1 and said[0]["gate"] == "DRADeviceBindingConditions", logs
        devices = [d for s in _stored(plugin).values() for d in s.get("devices") or []]
        assert devices and not any(d.get("bindingConditions") for d in devices)

        writes = plugin.publisher.writes
        assert plugin.publish(read_inventory(session)) is False  # left out: equal as stored
        assert plugin.publisher.writes == writes
    finally:
        session.close()


def test_dropped_taints_are_seen_said_once_and_left_out(
    binding_off: ControlPlane, short_tmp: Path
) -> None:
    """With DRADeviceTaints off the API server stores the devices without their taints: the
    driver says so once and publishes without them, so a later publish writes nothing."""
    import time

    from kubernetes import config

    from nodeagent.state.faults import Fault, FaultKey

    api = config.new_client_from_config(str(binding_off.kubeconfig))
    make_node(api, "n-taints-off")
    plugin, session = _plugin(short_tmp, binding_off, "n-taints-off", "h200")
    faults = {FaultKey(0): Fault(("xid-79",), time.time())}
    try:
        with captured_logs("warning") as logs:
            assert plugin.publish(read_inventory(session), faults) is True
            said = [e for e in logs if e["event"] == "dra.taints_dropped"]
            assert plugin.publisher.taints_dropped is True
            assert not any(
                d.get("taints") for s in _stored(plugin).values() for d in s.get("devices") or []
            )
            writes = plugin.publisher.writes
            assert plugin.publish(read_inventory(session), faults) is False  # nothing to write
            assert plugin.publisher.writes == writes
        assert len(said) == 1 and said[0]["gate"] == "DRADeviceTaints"
    finally:
        plugin.stop()
        session.close()

"""The real control plane (../shared/k8s, Kubernetes v1.36.2) for the tests of this folder:
one per test session, shared by the xdist workers, stopped at the session's end
(tests/conftest.py). Each test works in a namespace and on Node names of its own."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import leaks
from tests.support.k8s import ControlPlane, k8s_available, required, shared_control_plane

kubernetes = pytest.importorskip("kubernetes")


@pytest.fixture(scope="session")
def control_plane() -> ControlPlane:
    if not k8s_available():
        if required():
            pytest.fail("../shared/k8s is not beside this checkout (CI needs it)")
        pytest.skip("../shared/k8s is not beside this checkout: no real control plane")
    try:
        return shared_control_plane(os.environ[leaks.MARKER])
    except RuntimeError as err:
        pytest.fail(str(err))


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane) -> Any:
    """The official client, as admin."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(str(control_plane.kubeconfig), client_configuration=configuration)
    return client.ApiClient(configuration)


@pytest.fixture
def namespace(api_client: Any) -> Iterator[str]:
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        core.delete_namespace(name)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory: unix sockets (an MPS daemon's pipe) take at most 107 bytes."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="k8s-", dir="/tmp"))
    yield root
    shutil.rmtree(root, ignore_errors=True)

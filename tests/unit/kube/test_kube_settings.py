"""The kube settings of mig-manager parity and the NodeFeature sink: one sentence for each bad
value, and the pure choice of what is paused."""

from __future__ import annotations

import pytest

from nodeagent.base.errors import ConfigError
from nodeagent.kube.clients import PAUSED, to_pause
from nodeagent.settings import DEFAULT_PAUSE_COMPONENTS, load

KUBE = {"NODEAGENT_KUBE": "1", "NODE_NAME": "n1"}


def test_the_node_feature_api_needs_the_agents_namespace() -> None:
    with pytest.raises(ConfigError) as err:
        load({}, {**KUBE, "NODEAGENT_NODE_FEATURE_API": "true"})
    assert str(err.value) == (
        "kube.node-feature-api needs the agent's namespace: POD_NAMESPACE (the downward API)"
        " or --pod-namespace"
    )
    settings, _ = load({}, {**KUBE, "NODEAGENT_NODE_FEATURE_API": "1", "POD_NAMESPACE": "gpu"})
    assert settings.kube.node_feature_api and settings.kube.pod_namespace == "gpu"


@pytest.mark.parametrize(
    "value", ["mig.config", "nvidia.com/", "/mig.config", "Nvidia.com/mig.config",
              "nvidia.com/" + "x" * 58, "nvidia.com/mig config", "nvidia.com/-mig"],
)  # fmt: skip
def test_a_bad_mig_config_label_is_one_sentence(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        load({}, {**KUBE, "NODEAGENT_MIG_CONFIG_LABEL": value})
    assert str(err.value).startswith(
        "environment variable NODEAGENT_MIG_CONFIG_LABEL: must be a label key such as"
    )


def test_the_mig_config_label_is_named_where_a_name_is_given_twice() -> None:
    environ = {**KUBE, "NODEAGENT_MIG_CONFIG_LABEL": "example.com/mig", "NODEAGENT_MIG_CONFIG": "x"}
    with pytest.raises(ConfigError, match=r"comes from the node label example\.com/mig; drop -c"):
        load({}, environ)
    settings, _ = load({}, {**KUBE, "NODEAGENT_MIG_CONFIG_LABEL": "example.com/mig"})
    assert settings.kube.mig_config_label == "example.com/mig"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, {}),  # nothing deployed by these labels here: nothing to pause
        ({"nvidia.com/gpu.deploy.dcgm": "false"}, {}),
        ({"nvidia.com/gpu.deploy.dcgm": ""}, {}),
        ({"nvidia.com/gpu.deploy.dcgm": "true"}, {"nvidia.com/gpu.deploy.dcgm": "true"}),
        ({"nvidia.com/gpu.deploy.nvsm": PAUSED}, {"nvidia.com/gpu.deploy.nvsm": "true"}),
        ({"nvidia.com/gpu.deploy.client": "custom"}, {"nvidia.com/gpu.deploy.client": "custom"}),
        ({"nvidia.com/gpu.deploy.mig-manager": "true"}, {}),  # not in the set
    ],
)
def test_what_is_paused_and_what_it_comes_back_to(
    labels: dict[str, str], expected: dict[str, str]
) -> None:
    assert to_pause(labels, dict.fromkeys(DEFAULT_PAUSE_COMPONENTS)) == expected

"""The DRA driver's deployment and the README's claim examples: valid resource.k8s.io/v1
objects (kubernetes-validate, strict), selectors that name attributes the driver publishes, an
agent that the rendered DaemonSet's settings switch to DRA with the kubelet's paths mounted."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nodeagent.cli.commands import build_parser
from nodeagent.dra.devices import gpu_devices, with_shares
from nodeagent.nvml import NvmlSession, read_inventory
from nodeagent.settings import load
from nodeagent.sim import SimulatedNvml, parse_spec
from tests.deploy.test_kustomize import render

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples" / "dra").glob("*.yaml"))
VERSION = "1.37.0"  # resource.k8s.io/v1 since 1.34; the newest schema kubernetes-validate has
ATTRIBUTE = re.compile(r'device\.attributes\["gpu\.nodeagent\.io"\]\.(\w+)')


def documents() -> list[dict[str, Any]]:
    docs = [d for path in EXAMPLES for d in yaml.safe_load_all(path.read_text()) if d]
    deployed = ("DeviceClass", "ClusterRole")
    return docs + [d for d in render("overlays/with-dra") if d["kind"] in deployed]


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_examples_validate_strictly(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, VERSION, strict=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_each_example_makes_its_namespaces_first(path: Path) -> None:
    """`kubectl apply -f` of one example file works on a cluster without its namespaces: each
    namespace an object names is a Namespace earlier in the same file."""
    made: set[str] = set()
    for doc in (d for d in yaml.safe_load_all(path.read_text()) if d):
        if doc["kind"] == "Namespace":
            made.add(doc["metadata"]["name"])
        namespace = doc["metadata"].get("namespace")
        assert namespace is None or namespace in made, f"{doc['metadata']['name']}: {namespace}"


def test_selectors_name_attributes_the_driver_publishes() -> None:
    session = NvmlSession(SimulatedNvml(parse_spec("h200")))
    inv = read_inventory(session)
    session.close()
    gpu = replace(inv.gpus[0], mig_current=True)
    devices = with_shares(inv, gpu, gpu_devices(inv, gpu), "gpu.nodeagent.io", "mig")
    published = {name for d in devices for name in d["attributes"]}
    profiles = {d["attributes"]["profile"]["string"] for d in gpu_devices(inv, gpu) if "profile" in d["attributes"]}  # fmt: skip
    text = yaml.safe_dump_all(documents())
    named = set(ATTRIBUTE.findall(text))
    assert named and named <= published
    assert {"1g.18gb", "1g.18gb+me"} <= profiles  # the 1g example's startsWith / '+' test
    assert all('device.driver == "gpu.nodeagent.io"' in yaml.safe_dump(d) for d in documents() if d["kind"] == "DeviceClass")  # fmt: skip


@pytest.mark.parametrize(
    "doc", render("overlays/with-dra"), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}"
)
def test_the_overlay_validates_strictly(doc: dict[str, Any]) -> None:
    """As tests/deploy/test_kustomize.py checks the other overlays, at the first version with
    resource.k8s.io/v1 in the schemas (the Prometheus Operator's kinds have none offline)."""
    if doc["kind"] not in ("ServiceMonitor", "PrometheusRule"):
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_the_daemonset_runs_the_driver_with_the_kubelets_paths() -> None:
    docs = render("overlays/with-dra")
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    args = build_parser().parse_args(container["args"])
    settings, _ = load(vars(args), {**{k: v for k, v in env.items() if v}, "NODE_NAME": "n"}, None, args.groups)  # fmt: skip
    assert settings.kube.enabled and settings.dra.enabled
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    wanted = {settings.dra.plugin_path.parent, settings.dra.registry_dir, settings.dra.cdi_dir}
    assert {str(p) for p in wanted} <= mounts
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    assert {"resourceslices", "resourceclaims"} <= {res for r in rules for res in r["resources"]}


def readme_documents() -> list[dict[str, Any]]:
    section = (REPO / "docs" / "dra.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", section, re.DOTALL)
    return [d for block in blocks for d in yaml.safe_load_all(block) if d]


def test_the_readme_examples_are_the_files() -> None:
    """The README's DRA examples validate and say what the deployed files say."""
    # A ResourceSlice shown is the driver's output, abridged (tests/unit/dra/test_shares.py).
    shown = [d for d in readme_documents() if d["kind"] != "ResourceSlice"]
    files = {(d["kind"], d["metadata"]["name"]): d for d in documents()}
    assert len(shown) == 11
    for doc in shown:
        kubernetes_validate.validate(doc, VERSION, strict=True)
        assert doc == files[(doc["kind"], doc["metadata"]["name"])]

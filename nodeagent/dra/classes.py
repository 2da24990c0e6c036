"""The DeviceClasses that select this driver's devices, with the extended resource names
NVIDIA's device plugin uses, so that an unchanged pod asking `nvidia.com/gpu: 1` or
`nvidia.com/mig-1g.18gb: 1` is served by DRA where a node has no device plugin. Pure.

resource.k8s.io/v1 DeviceClassSpec.extendedResourceName (KEP-5004, the DRAExtendedResource
feature gate: beta and on by default in 1.36; kubernetes/api@10b39a39bcee:
resource/v1/types.go): the devices of a class with that name satisfy a pod's extended resource
request on every node that does not advertise the resource in its Node's allocatable (the
scheduler's dynamicresources plugin, filterExtendedResources: a node with the resource in
allocatable is the device plugin's, one without it gets the pod's request as a ResourceClaim
the scheduler makes). Each name should belong to one class in the cluster (two: the newest wins).

The names are the device plugin's (k8s-device-plugin's mixed MIG strategy): `nvidia.com/gpu` for
a whole GPU, `nvidia.com/mig-<name>` for a MIG device, <name> as GFD and the plugin derive it
from the device's memory (nodeagent.labels.gfd.mig_device_name: 1g.18gb+me -> 1g.18gb.me). A
class per name selects the MIG profiles that carry the name on the GPU models given; a profile
that carries different names on different models is told apart by the GPU's productName.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import yaml

from nodeagent.dra.resource import API_VERSION
from nodeagent.labels.gfd import mig_device_name
from nodeagent.nvml.inventory import GiProfile, Gpu, Inventory, MigAttributes

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
MIB = 1024 * 1024


def _class(name: str, expression: str, resource: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
    if resource is not None:
        spec["extendedResourceName"] = resource
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": spec,
    }


def cel_string(text: str) -> str:
    """A CEL string literal (profile and product names hold no quote or backslash; escaped
    all the same)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def plugin_mig_name(gpu: Gpu, profile: GiProfile) -> str:
    """The device plugin's name of a MIG device of `profile` (a full compute instance, as
    nodeagent's claims make them) on `gpu`: '1g.18gb', '1g.18gb.me'."""
    attributes = MigAttributes(
        memory_mib=profile.memory_bytes // MIB,
        multiprocessor_count=profile.multiprocessor_count,
        gi_slice_count=profile.slice_count,
        ci_slice_count=profile.slice_count,
        engines=profile.engines,
    )
    return mig_device_name(gpu, profile.name, attributes)


def cel_attribute(driver: str, name: str) -> str:
    return f"device.attributes[{cel_string(driver)}].{name}"


def _base(driver: str, kind: str) -> str:
    """The guard every selector starts with: this driver's devices of `kind` (gpu, mig). The
    attributes are read only behind `device.driver == ...` (another driver's device has none
    of this domain, and CEL's && does not evaluate past a false)."""
    kind_is = f"{cel_attribute(driver, 'type')} == {cel_string(kind)}"
    return f"device.driver == {cel_string(driver)} && {kind_is}"


def mig_names(gpus: Iterable[Gpu]) -> dict[str, set[tuple[str, str]]]:
    """Each device plugin MIG name -> the (productName, profile) pairs that carry it."""
    names: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for gpu in gpus:
        if not gpu.mig_capable:
            continue
        for profile in gpu.profiles:
            names[plugin_mig_name(gpu, profile)].add((gpu.name, profile.name))
    return dict(names)


def _profile_selector(driver: str, pairs: set[tuple[str, str]], ambiguous: set[str]) -> str:
    profile, product = cel_attribute(driver, "profile"), cel_attribute(driver, "productName")
    terms = []
    for product_name, profile_name in sorted(pairs):
        term = f"{profile} == {cel_string(profile_name)}"
        if profile_name in ambiguous:
            term = f"({product} == {cel_string(product_name)} && {term})"
        if term not in terms:
            terms.append(term)
    either = terms[0] if len(terms) == 1 else "(" + " || ".join(terms) + ")"
    return f"{_base(driver, 'mig')} && {either}"


def mig_class_name(plugin_name: str, driver: str) -> str:
    """'mig-1g.18gb.gpu.nodeagent.io': a DNS subdomain (plugin names are lower case, dotted)."""
    return f"mig-{plugin_name}.{driver}"


def device_classes(inventories: Iterable[Inventory], driver: str) -> list[dict[str, Any]]:
    """Every DeviceClass for `driver`'s devices on the GPUs of `inventories`: a whole GPU
    (`<driver>`, extended resource nvidia.com/gpu), any MIG slice (`mig.<driver>`, no extended
    resource: a pod asking for one names a profile), any MPS share (`mps.<driver>`: a GPU's or
    a slice's share device, sized by the claim's capacity requests), and one class per device
    plugin MIG name (`mig-<name>.<driver>`, extended resource nvidia.com/mig-<name>), sorted
    by name."""
    gpus = [g for inv in inventories for g in inv.gpus]
    names = mig_names(gpus)
    carried: dict[str, set[str]] = defaultdict(set)  # profile -> the plugin names it carries
    for plugin_name, pairs in names.items():
        for _, profile_name in pairs:
            carried[profile_name].add(plugin_name)
    ambiguous = {p for p, n in carried.items() if len(n) > 1}
    out = [
        _class(driver, _base(driver, "gpu"), GPU_RESOURCE),
        _class(f"mig.{driver}", _base(driver, "mig")),
        _class(f"mps.{driver}", _base(driver, "mps")),
    ]
    for plugin_name in sorted(names):
        selector = _profile_selector(driver, names[plugin_name], ambiguous)
        resource = MIG_RESOURCE_PREFIX + plugin_name
        out.append(_class(mig_class_name(plugin_name, driver), selector, resource))
    return out


class _Dumper(yaml.SafeDumper):
    """Selectors folded (`>-`), one condition a line, as a person writes them."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    if " && " in text:
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=">")
    return dumper.represent_str(text)


_Dumper.add_representer(str, _str)


def dump_classes(classes: Iterable[dict[str, Any]], header: str = "") -> str:
    """The classes as one YAML stream (`kubectl apply -f -`), after `header` (comment lines)."""
    body = yaml.dump_all(classes, Dumper=_Dumper, sort_keys=False, width=100)
    return header + body

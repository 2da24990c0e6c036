"""A node plan (nodeagent.planner) as the DRA side of it: one ResourceClaimTemplate
(resource.k8s.io/v1) per workload and kind of place, for `kubectl apply -f`. Pure.

Where the plan puts a replica, its claim asks for the same from this driver:

- an MPS share of a GPU (a `shared` workload the plan puts beside others through MPS): the
  DeviceClass `mps.<driver>`, a GPU's share device (`shareOf == "gpu"`), and capacity requests
  `<driver>/sm` (its compute need in percent of the GPU's SMs, rounded up to a multiple of
  nodeagent.dra.capacity.SM_STEP_PERCENT, as the share device's request policy takes them; a
  workload without one asks for one step) and `<driver>/memory` (its memory, whole MiB). A
  workload's `compute-limit` and `compute-priority` become an MpsShare config of the claim
  (`smLimit` in percent, at least the request; `priority`);
- a MIG slice: the DeviceClass `mig.<driver>` and the slice's profile (the scheduler picks the
  placement; the driver makes the slice when the pod lands);
- a whole GPU: the DeviceClass `<driver>`.

Pods of a workload name its template (`resourceClaimTemplateName`); replicas the plan puts in
different kinds of place (some in MIG slices of two profiles, say) get a template per kind,
named `<workload>-<kind>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from nodeagent.base.errors import ConfigError
from nodeagent.base.logs import printable
from nodeagent.dra.capacity import MEMORY_CAPACITY, SM_CAPACITY, SM_STEP_PERCENT, binary_quantity
from nodeagent.dra.claims import CONFIG_API_VERSION, SHARE_KIND
from nodeagent.dra.classes import cel_attribute, cel_string
from nodeagent.dra.devices import dns_label
from nodeagent.dra.resource import API_VERSION
from nodeagent.nvml.inventory import Gpu
from nodeagent.planner.options import Demand, GpuView, ceil_percent
from nodeagent.planner.planner import NodePlan
from nodeagent.planner.render import summary_lines
from nodeagent.planner.workloads import Workload

MIB = 1 << 20
MAX_NAME = 253  # a ResourceClaimTemplate's name: a DNS subdomain
REQUEST = {"share": "share", "slice": "slice", "gpu": "gpu"}  # the request's name, per kind


@dataclass(frozen=True)
class Claim:
    """What one replica's claim asks for: `kind` share | slice | gpu."""

    kind: str
    sm_percent: int = 0  # share: the request
    memory_mib: int = 0  # share
    sm_limit_percent: int | None = None  # share: the MpsShare's smLimit
    priority: str | None = None  # share: the MpsShare's priority
    profile: str = ""  # slice

    @property
    def suffix(self) -> str:
        if self.kind == "share":
            return f"share-{self.sm_percent}"
        if self.kind == "slice":
            return dns_label(self.profile.replace(".", "-"))
        return "gpu"


@dataclass(frozen=True)
class Template:
    name: str
    workload: Workload
    claim: Claim
    replicas: int  # of the plan's that use it


def share_percent(w: Workload, gpu_sms: int | None) -> int:
    """A share's `sm` request for `w` on a GPU of `gpu_sms` SMs: its compute need in percent,
    rounded up to the request policy's step (at least one step)."""
    demand = Demand(w.memory_mib, w.compute, w.sms, w.isolation, w.priority, 1, SM_STEP_PERCENT)
    percent = demand.percent_on(gpu_sms)
    return SM_STEP_PERCENT if percent is None else percent


def _claim(w: Workload, mode: str, profile: str | None, gpu_sms: int | None) -> Claim:
    if mode == "mig":
        assert profile is not None
        return Claim("slice", profile=profile)
    if mode == "whole":
        return Claim("gpu")
    percent = share_percent(w, gpu_sms)
    limit = None
    if w.compute_limit is not None:
        limit = max(percent, ceil_percent(w.compute_limit))
    return Claim("share", percent, w.memory_mib, limit, w.compute_priority)


def templates(plan: NodePlan, workloads: Sequence[Workload], gpus: Sequence[Gpu]) -> list[Template]:
    """The templates the plan's placed replicas need, in workload file order. Raises
    ConfigError when two would have one name (workload names alike but for case or signs)."""
    sms = {g.index: GpuView.of(g).sms for g in gpus}
    by_name = {w.name: w for w in workloads}
    counts: dict[str, dict[Claim, int]] = {w.name: {} for w in workloads}
    for p in plan.placed:
        claim = _claim(by_name[p.workload], p.mode, p.profile, sms.get(p.gpu))
        counts[p.workload][claim] = counts[p.workload].get(claim, 0) + 1
    out: list[Template] = []
    seen: dict[str, str] = {}
    for w in workloads:
        base = dns_label(w.name)
        for claim, n in counts[w.name].items():
            name = base if len(counts[w.name]) == 1 else f"{base}-{claim.suffix}"
            if not base or len(name) > MAX_NAME:
                raise ConfigError(
                    f"workload {printable(w.name)!r} makes no claim template name (lower-case"
                    f" letters, digits and '-', at most {MAX_NAME}); rename it"
                )
            if name in seen:
                raise ConfigError(
                    f"workloads {printable(seen[name])!r} and {printable(w.name)!r} both make"
                    f" the claim template name {name!r}; rename one"
                )
            seen[name] = w.name
            out.append(Template(name, w, claim, n))
    return out


def template_document(t: Template, driver: str) -> dict[str, Any]:
    """One ResourceClaimTemplate (resource.k8s.io/v1), without a namespace (`kubectl -n`)."""
    c = t.claim
    request = REQUEST[c.kind]
    exactly: dict[str, Any]
    devices: dict[str, Any]
    if c.kind == "gpu":
        exactly = {"deviceClassName": driver}
    elif c.kind == "slice":
        exactly = {
            "deviceClassName": f"mig.{driver}",
            "selectors": [{"cel": {"expression": _equals(driver, "profile", c.profile)}}],
        }
    else:
        exactly = {
            "deviceClassName": f"mps.{driver}",
            "selectors": [{"cel": {"expression": _equals(driver, "shareOf", "gpu")}}],
            "capacity": {
                "requests": {
                    f"{driver}/{SM_CAPACITY}": str(c.sm_percent),
                    f"{driver}/{MEMORY_CAPACITY}": binary_quantity(c.memory_mib * MIB),
                }
            },
        }
    devices = {"requests": [{"name": request, "exactly": exactly}]}
    parameters: dict[str, Any] = {"apiVersion": CONFIG_API_VERSION, "kind": SHARE_KIND}
    if c.sm_limit_percent is not None:
        parameters["smLimit"] = c.sm_limit_percent
    if c.priority is not None:
        parameters["priority"] = c.priority
    if len(parameters) > 2:
        opaque = {"driver": driver, "parameters": parameters}
        devices["config"] = [{"requests": [request], "opaque": opaque}]
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": t.name},
        "spec": {"spec": {"devices": devices}},
    }


def _equals(driver: str, attribute: str, value: str) -> str:
    """A CEL test of one of the driver's string attributes (values hold no quote: profile
    names; escaped all the same)."""
    return f"{cel_attribute(driver, attribute)} == {cel_string(value)}"


def _what(t: Template) -> str:
    c = t.claim
    if c.kind == "gpu":
        place = "a whole GPU"
    elif c.kind == "slice":
        place = f"a MIG slice {c.profile}" + _dropped(t.workload)
    else:
        place = f"an MPS share of a GPU: {c.sm_percent} % of its SMs"
        place += f" (limit {c.sm_limit_percent} %)" if c.sm_limit_percent is not None else ""
        place += f", {c.priority} priority" if c.priority is not None else ""
        place += f", {binary_quantity(c.memory_mib * MIB)} of its memory"
    return f"{t.workload.name}: {t.replicas} of {t.workload.replicas} replicas, each {place}"


def _dropped(w: Workload) -> str:
    """What a shared workload's slice does not carry: its MPS share's limit and priority."""
    dropped = [
        key
        for key, value in (
            ("compute-limit", w.compute_limit),
            ("compute-priority", w.compute_priority),
        )
        if value is not None
    ]
    if not dropped:
        return ""
    verb = "do" if len(dropped) > 1 else "does"
    return f" (its {' and '.join(dropped)} {verb} not apply: a slice is no MPS share)"


HEADER = """\
# ResourceClaimTemplates of the DRA driver {driver} for this plan (`nodeagent plan -o dra`):
# `kubectl apply -n NAMESPACE -f FILE`, then each pod of a workload names its template
# (spec.resourceClaims: [{{name: gpu, resourceClaimTemplateName: NAME}}], and its containers
# resources.claims: [{{name: gpu}}]). The node runs the agent with --dra, with
# dra.mps-shares: gpus where a template asks for an MPS share. docs/dra.md#sizing-shares.
"""


def render_claims(
    plan: NodePlan, workloads: Sequence[Workload], gpus: Sequence[Gpu], driver: str
) -> str:
    """The templates as one YAML stream, the plan's report and each template's replicas as
    comments. Raises ConfigError (templates)."""
    chosen = templates(plan, workloads, gpus)
    head = HEADER.format(driver=driver) + "".join(f"# {line}\n" for line in summary_lines(plan))
    docs = []
    for t in chosen:
        body = yaml.safe_dump(template_document(t, driver), sort_keys=False, width=100)
        docs.append(f"# {printable(_what(t))}\n{body}")
    return head + "---\n".join(docs)

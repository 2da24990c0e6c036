"""dcgm-exporter's families (`DCGM_FI_*`) with its labels, from the same store the native
collectors read: for `metrics.dcgm-compat`, so that dashboards and alerts written for
dcgm-exporter keep working on the agent's own /metrics.

dcgm-exporter (d5e5f51, default `-d f`) labels each series `gpu`, `UUID`, `pci_bus_id`,
`device` (`nvidia<N>`), `modelName`; `GPU_I_PROFILE` and `GPU_I_ID` on a GPU instance of a MIG
GPU (a MIG GPU's series are per GPU instance; the GPU itself has none unless it has no GPU
instance); `hostname` (NODE_NAME, else the host's name); the `DCGM_FI_DRIVER_VERSION` label
counter; and, where a pod holds the device (kubelet pod-resources), `pod`, `namespace`,
`container`. `DCGM_FI_DEV_XID_ERRORS` adds `err_code` and `err_msg`. Counters keep their names
(no `_total`), which prometheus_client cannot render: this module writes the text format itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cache
from importlib import resources

from nodeagent.metrics.dcgmfields import COUNTERS, VALUES, Entity
from nodeagent.metrics.pods import attribute
from nodeagent.state.snapshot import Holders, Inventory, Store

UNKNOWN_XID = "Unknown Error"  # dcgm-exporter's err_msg for a code outside its table


@cache
def xid_messages() -> dict[int, str]:
    """NVIDIA's XID catalogue, as dcgm-exporter names each code in `err_msg`."""
    text = resources.files("nodeagent.metrics").joinpath("xid_messages.tsv").read_text()
    rows = (line.split("\t", 1) for line in text.splitlines() if line and line[0] != "#")
    return {int(code): message for code, message in rows}


def _number(v: float) -> str:
    """Integers as dcgm-exporter prints DCGM's int64 fields (`%d`), others in full."""
    v = float(v)
    return str(int(v)) if v.is_integer() and abs(v) < 2**63 else repr(v)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _holders_by_device(inventory: Inventory, holders: Holders) -> dict[str, dict[str, str]]:
    """{GPU UUID or '<gpu>-<gi id>': pod labels} from the pod attribution the native series
    use: a replica `<uuid>::<n>` is its device and a MIG device its GPU instance, as in
    dcgm-exporter; where several containers hold one device, one of them names it (the last in
    the attribution's order; dcgm-exporter: the last in the kubelet's answer). DRA claims are
    no pods here (dcgm-exporter's DRA labels are an option of their own)."""
    found = attribute(inventory, holders)
    keyed = [(f"{gpu}-{gi_id}", h) for gpu, gi_id, _, _, h in found.slices]
    keyed += [(uuid, h) for _, uuid, _, h in found.gpus]
    return {
        key: {"container": h.container, "namespace": h.namespace, "pod": h.pod} for key, h in keyed
    }


class DcgmExposition:
    """Renders the DCGM families of the latest snapshot; `enabled` is read at each render, so
    a reload turns them on or off."""

    def __init__(self, store: Store, hostname: str, enabled: Callable[[], bool]) -> None:
        self.store = store
        self.hostname = hostname
        self.enabled = enabled

    def entities(self) -> list[tuple[dict[str, str], Entity]]:
        """(labels, values) of every monitored entity, in GPU then GPU instance order."""
        snap = self.store.snapshot
        if snap is None:
            return []
        inventory, telemetry = snap.inventory, snap.telemetry
        health, fields, gpm = self.store.health, self.store.fields, self.store.gpm
        pods = _holders_by_device(inventory, snap.holders)
        out: list[tuple[dict[str, str], Entity]] = []
        for gpu in inventory.gpus:
            i = gpu.index
            base = {
                "gpu": str(i),
                "UUID": gpu.uuid,
                "pci_bus_id": gpu.pci_bus_id,
                "device": f"nvidia{i}",
                "modelName": gpu.name,
            }
            read = fields.by_gpu.get(i)
            reserved = None if read is None else read.memory_reserved_bytes
            device = Entity(
                health=health.by_gpu.get(i),
                fields=read,
                gpm=dict(gpm.by_gpu.get(i, {})),
                utilization=telemetry.utilization.get(i),
                memory_utilization=telemetry.memory_utilization.get(i),
                memory=(gpu.memory_total_bytes, gpu.memory_used_bytes, reserved),
                pcie_rates=fields.pcie_rates.get(i),
                last_xid=health.last_xid.get(i) if i in health.xid_counts else None,
            )
            gis = {} if not gpu.mig_current else {s.gi_id: s for s in reversed(gpu.slices)}
            if not gis:
                out.append(({**base, **self._tail(gpu.uuid, pods)}, device))
                continue
            for gi_id, s in sorted(gis.items()):
                labels = {**base, "GPU_I_PROFILE": s.profile, "GPU_I_ID": str(gi_id)}
                entity = replace(
                    device,
                    gpm=dict(gpm.by_gi.get((i, gi_id), {})),
                    utilization=None,
                    memory_utilization=None,
                    memory=(s.memory_total_bytes, s.memory_used_bytes, None),
                    pcie_rates=None,
                    gi=(s.profile, gi_id),
                )
                out.append(({**labels, **self._tail(f"{i}-{gi_id}", pods)}, entity))
        return out

    def _tail(self, device: str, pods: dict[str, dict[str, str]]) -> dict[str, str]:
        driver = self.store.snapshot.inventory.driver_version if self.store.snapshot else ""
        tail = {"hostname": self.hostname} if self.hostname else {}
        return {**tail, "DCGM_FI_DRIVER_VERSION": driver, **pods.get(device, {})}

    def render(self) -> bytes:
        """The text format of every DCGM family with at least one series; b'' when disabled."""
        if not self.enabled():
            return b""
        entities = self.entities()
        out: list[str] = []
        for name, kind, text in COUNTERS:
            value = VALUES.get(name)
            if value is None:  # a label counter, or one nodeagent cannot have (NOT_EMITTED)
                continue
            lines = []
            for labels, entity in entities:
                v = value(entity)
                if v is None:
                    continue
                if name == "DCGM_FI_DEV_XID_ERRORS":
                    code = int(v)
                    message = xid_messages().get(code, UNKNOWN_XID)
                    labels = {**labels, "err_code": str(code), "err_msg": message}
                body = ",".join(f'{k}="{_escape(val)}"' for k, val in _ordered(labels))
                lines.append(f"{name}{{{body}}} {_number(v)}\n")
            if lines:
                out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")
                out.extend(lines)
        return "".join(out).encode()


_FIRST = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE", "GPU_I_ID")


def _ordered(labels: dict[str, str]) -> list[tuple[str, str]]:
    """dcgm-exporter's order: the identity labels, hostname, the label counters, then the
    attributes sorted by name (Go templates range over maps in key order)."""
    first = [(k, labels[k]) for k in _FIRST if k in labels]
    middle = [(k, labels[k]) for k in ("hostname", "DCGM_FI_DRIVER_VERSION") if k in labels]
    rest = sorted((k, v) for k, v in labels.items() if k not in _FIRST and k not in dict(middle))
    return first + middle + rest

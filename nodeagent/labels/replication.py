"""How GFD's labels see a resource shared: replicas, strategy, renamed. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Replication:
    """What the device plugin's config says of the full-GPU resource (`nvidia.com/gpu`): its
    sharing strategy (none, mps, time-slicing) and replicas."""

    strategy: str = "none"
    replicas: int = 1
    renamed: bool = False  # renameByDefault: the shared resource is `<name>.shared`, no -SHARED


UNSHARED = Replication()


@dataclass(frozen=True)
class ResourceSharing:
    """The device plugin config's sharing as GFD reads it: one strategy for the node (MPS when
    any MPS resource has replicas, else time-slicing when any time-sliced one has), and the
    replicas of each resource listed (keys without the `nvidia.com/` prefix: `gpu`,
    `mig-1g.18gb`). A resource it does not list has 1 replica and strategy none."""

    strategy: str = "none"
    replicas: Mapping[str, int] = field(default_factory=dict)
    renamed: bool = False

    def of(self, resource: str) -> Replication:
        replicas = self.replicas.get(resource, 1)
        strategy = self.strategy if replicas > 1 else "none"
        return Replication(strategy, replicas, self.renamed)


def sharing_of(replication: Replication | ResourceSharing, resource: str) -> Replication:
    """What `resource` gets: a Replication describes nvidia.com/gpu alone (the config nodeagent
    writes shares no MIG resource), a ResourceSharing every resource it lists."""
    if isinstance(replication, ResourceSharing):
        return replication.of(resource)
    return replication if resource == "gpu" else UNSHARED

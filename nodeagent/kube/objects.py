"""Objects of a list or a watch, each read on its own: one that cannot be read (`read` raises
Unreadable: nodeagent.base.shapes) is skipped and said once while it stays so (a warning
`kube.object_skipped` and nodeagent_kube_objects_skipped_total), and never fails the list or
the other objects. Every list the agent reads goes through here: the informers' (their Node,
the ResourceClaims), the DRA driver's ResourceSlices, the pods on the node."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from nodeagent.base.logs import get_logger
from nodeagent.base.shapes import Unreadable
from nodeagent.metrics.kube import KUBE_SKIPPED, ObjectKey, SkippedObjects

log = get_logger("nodeagent.kube")
T = TypeVar("T")


def object_key(resource: str, obj: object) -> ObjectKey:
    """(resource, namespace, name) of `obj`, as far as its metadata says."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    namespace, name = meta.get("namespace"), meta.get("name")
    return (
        resource,
        namespace if isinstance(namespace, str) else "",
        name if isinstance(name, str) else "",
    )


def read_list(
    resource: str,
    objects: Sequence[object],
    read: Callable[[dict[str, Any]], T],
    skipped: SkippedObjects = KUBE_SKIPPED,
) -> list[T]:
    """The objects of a full list of `resource` that `read` can read (each other one skipped,
    said once); a skipped object the list lacks is said gone."""
    out: list[T] = []
    keys = set()
    for obj in objects:
        keys.add(object_key(resource, obj))
        item = read_object(resource, obj, read, skipped)
        if item is not None:
            out.append(item)
    for gone in skipped.listed(resource, keys):
        log.info("kube.object_gone", resource=gone[0], namespace=gone[1], name=gone[2])
    return out


def read_object(
    resource: str,
    obj: object,
    read: Callable[[dict[str, Any]], T],
    skipped: SkippedObjects = KUBE_SKIPPED,
    said: bool = True,
) -> T | None:
    """`obj` as `read` makes it, or None: skipped (a warning `kube.object_skipped` and
    nodeagent_kube_objects_skipped_total, said once while it stays unreadable)."""
    key = object_key(resource, obj)
    try:
        if not isinstance(obj, dict):
            raise Unreadable(f"a {resource} object is not a JSON object", "")
        item = read(obj)
    except Unreadable as err:
        if said and skipped.skipped(key, err.field or "the object"):
            log.warning(
                "kube.object_skipped",
                resource=key[0], namespace=key[1], name=key[2], error=str(err),
            )  # fmt: skip
        return None
    if skipped.readable(key):
        log.info("kube.object_readable", resource=key[0], namespace=key[1], name=key[2])
    return item

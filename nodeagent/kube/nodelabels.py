"""The Kubernetes label sink: the smallest merge patch that makes the Node carry our labels.

The keys nodeagent owns are recorded in an annotation; a key it owned before and no longer
publishes is removed; any other key is never touched. No change, no patch. Pure.
"""

from __future__ import annotations

import json
from typing import Any

from nodeagent.base.jsontext import NotJson, parse_json

ANNOTATION_PREFIX = "nodeagent.io/"
OWNED_LABELS = ANNOTATION_PREFIX + "owned-labels"


def owned_before(node: dict[str, Any]) -> set[str]:
    raw = (node.get("metadata", {}).get("annotations") or {}).get(OWNED_LABELS)
    if not isinstance(raw, str) or not raw:
        return set()
    try:  # anybody may write an annotation: deep nesting, a number, bytes that are not JSON
        keys = parse_json(raw.encode("utf-8", "surrogatepass"))
    except NotJson:
        return set()
    return {k for k in keys if isinstance(k, str)} if isinstance(keys, list) else set()


def label_patch(
    node: dict[str, Any], labels: dict[str, str], annotations: dict[str, str | None] | None = None
) -> dict[str, Any] | None:
    """The merge patch for `node` to carry exactly our `labels` (and these annotations; None
    removes one), or None when it already does."""
    meta = node.get("metadata", {})
    current = meta.get("labels") or {}
    current_ann = meta.get("annotations") or {}
    set_labels: dict[str, str | None] = {k: v for k, v in labels.items() if current.get(k) != v}
    for key in owned_before(node) - set(labels):
        if key in current:
            set_labels[key] = None
    owned = json.dumps(sorted(labels), separators=(",", ":"))
    set_ann: dict[str, str | None] = {}
    if current_ann.get(OWNED_LABELS) != owned:
        set_ann[OWNED_LABELS] = owned
    for key, value in (annotations or {}).items():
        if value is None and key in current_ann:
            set_ann[key] = None
        elif value is not None and current_ann.get(key) != value:
            set_ann[key] = value
    body: dict[str, Any] = {}
    if set_labels:
        body.setdefault("metadata", {})["labels"] = set_labels
    if set_ann:
        body.setdefault("metadata", {})["annotations"] = set_ann
    return body or None

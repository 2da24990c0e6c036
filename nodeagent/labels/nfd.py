"""The Node Feature Discovery local-source sink: a features.d file, written atomically."""

from __future__ import annotations

from pathlib import Path

from nodeagent.base.files import os_refusal, write_if_changed

DEFAULT_FEATURES_FILE = Path("/etc/kubernetes/node-feature-discovery/features.d/nodeagent")


def render_features(labels: dict[str, str]) -> str:
    """NFD's local source format: one `name=value` per line."""
    return "".join(f"{k}={v}\n" for k, v in sorted(labels.items()))


def write_features(path: Path, labels: dict[str, str]) -> bool:
    """Write the file if its content changes; return whether it was written. Raises
    ConfigError when the path is not a regular file or cannot be written there, AgentError
    when the system refused (a full disk)."""
    try:
        return write_if_changed(path, render_features(labels), "NFD features file", 0o644)
    except OSError as err:
        raise os_refusal(err, f"cannot write NFD features file {path}") from err

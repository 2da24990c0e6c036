"""JSON records the agent wrote itself and reads back (the ownership record, the DRA
checkpoint, the CDI specs it reads as traces): decoded and parsed with every failure in our
words, and sealed with a checksum where the agent is their only writer. A file edited by
hand, cut short by a full disk or made by an attacker may hold anything: bytes that are not
UTF-8, 100,000 nested arrays (Python's parser recurses and would raise RecursionError), a
number of a million digits."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from nodeagent.base.errors import ConfigError


class NotJson(ConfigError):
    """Bytes that are no JSON text; the message is what they are instead ("not UTF-8 text
    (bad byte at offset 3)"), for the caller to put after the file's name and "is"."""


def parse_json(data: bytes) -> object:
    """The JSON value of `data`. Raises NotJson for bytes that are not UTF-8, text that is not
    JSON, nesting deeper than the parser takes, a number too long to read."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise NotJson(f"not UTF-8 text (bad byte at offset {err.start})") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise NotJson(f"not JSON (line {err.lineno}, column {err.colno}: {err.msg})") from err
    except ValueError as err:  # int() of a number with thousands of digits
        raise NotJson("not JSON: a number is too long") from err
    except RecursionError as err:
        raise NotJson("not JSON: it is nested too deeply") from err


CHECKSUM = "checksum"


def _sum(payload: Mapping[str, Any]) -> str:
    body = {k: v for k, v in payload.items() if k != CHECKSUM}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def sealed_text(payload: Mapping[str, Any]) -> str:
    """`payload` as a record's text, with its checksum (as the kubelet's checkpointmanager
    seals its checkpoints): a record changed by hand or cut short is told from one the agent
    wrote."""
    return json.dumps({**payload, CHECKSUM: _sum(payload)}, indent=1, sort_keys=True) + "\n"


def check_seal(data: Mapping[str, Any]) -> str | None:
    """Why `data` (a record read back) is not as the agent sealed it, or None when its
    checksum matches its content."""
    written = data.get(CHECKSUM)
    if written is None:
        return "it has no checksum"
    if written != _sum(data):
        return "its checksum does not match its content (it was changed by hand or cut short)"
    return None

"""JSON records the agent wrote itself and reads back (the ownership record, the DRA
checkpoint, the CDI specs it reads as traces): decoded and parsed with every failure in our
words. A file edited by hand, cut short by a full disk or made by an attacker may hold
anything: bytes that are not UTF-8, 100,000 nested arrays (Python's parser recurses and would
raise RecursionError), a number of a million digits."""

from __future__ import annotations

import json

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

"""Reading the files a user hands the agent: bounded, regular files only, YAML with positions.

Every config the agent reads (MIG and sharing configs, the settings file, the hooks file, the
workload file, the device plugin's config, the machine-type file) comes through `read_bytes`
(nodeagent.base.files.read_input, the one opener): at most MAX_FILE_BYTES, and only a regular file
(or stdin for `-`), so `/dev/zero`, a FIFO, a loop of links or a 100 MiB file named as a
config is one sentence naming it, never a MemoryError or a hang. The configs of `-f` (MIG,
sharing, workloads) may also be a pipe (`-f <(generate)`, read_pipe: bounded in size and
time, read once and kept as stdin is).
`compose` and `Errors` give the strict parsers their file:line:col; `ConfigCache` keeps a file
that is read every reconcile parsed until it changes. Bottom layer: imports only errors and files.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import yaml

from nodeagent.base.errors import ConfigError
from nodeagent.base.files import FileTooLarge, is_pipe, read_input, read_pipe

MAX_FILE_BYTES = 4 * 1024 * 1024  # the largest upstream config seen is ~30 KiB
PIPE_SECONDS = 30.0  # how long `-f <(generate)` may take to write its config
MAX_ERRORS = 20  # a file of 200,000 configs aliasing one bad entry must not print 19 MB
MAX_ALIASES = 100_000  # upstream configs use a few dozen (`<<: *defaults`, shared lists)
MAX_EXPANDED_NODES = 1_000_000  # values of a file once its aliases are expanded
STANDARD_TAG = "tag:yaml.org,2002:"
T = TypeVar("T")


def read_bytes(path: str, what: str, pipe: bool = False) -> bytes:
    """The bytes of `path` (`-`: standard input), at most MAX_FILE_BYTES, read through
    nodeagent.base.files.read_input (the one opener); with `pipe`, a pipe too (read_pipe,
    within PIPE_SECONDS). Raises ConfigError naming `what` and the path for a missing or
    unreadable file (UnreadableFile), one that is not a regular file (folder, FIFO unless
    `pipe`, device, socket, a loop of links), and one that is too large."""
    if pipe and path != "-" and is_pipe(path):
        return read_pipe(path, what, MAX_FILE_BYTES, PIPE_SECONDS)
    if path == "-":
        stream = getattr(sys.stdin, "buffer", None)
        data = (
            stream.read(MAX_FILE_BYTES + 1)
            if stream is not None
            else sys.stdin.read(MAX_FILE_BYTES + 1).encode()
        )
        if len(data) > MAX_FILE_BYTES:
            raise FileTooLarge(
                f"cannot read {what} <stdin>: it is larger than {MAX_FILE_BYTES >> 20} MiB"
            )
        return data
    return read_input(path, what, MAX_FILE_BYTES)


def read_text(path: str, what: str, pipe: bool = False) -> str:
    """`read_bytes` decoded as UTF-8: a bad byte is one sentence with its offset."""
    data = read_bytes(path, what, pipe)
    source = "<stdin>" if path == "-" else path
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(
            f"{what} {source} is not UTF-8 text (bad byte at offset {err.start})"
        ) from err


class ConfigCache(Generic[T]):
    """A config file read every reconcile, parsed again only when it changed (path, size,
    mtime). `loader` reads and parses it; `-` (stdin) and a pipe are read once and kept."""

    def __init__(self, loader: Callable[[str | None], T], what: str) -> None:
        self.loader = loader
        self.what = what
        self._key: tuple[str, int, int] | None = None
        self._config: T | None = None

    def load(self, path: str | None) -> T:
        """Like the loader; a file that did not change is not read again."""
        if not path:
            return self.loader(path)
        if path == "-":
            key = ("-", 0, 0)
        else:
            try:
                st = os.stat(path)
            except OSError:  # the loader's read (the one opener) says why, in its words
                self._config, self._key = None, None
                return self.loader(path)
            key = (path, 0, 0) if stat.S_ISFIFO(st.st_mode) else (path, st.st_size, st.st_mtime_ns)
        if key != self._key or self._config is None:
            self._config, self._key = None, None
            self._config = self.loader(path)
            self._key = key
        return self._config


# -- YAML with positions ------------------------------------------------------------------


@dataclass(frozen=True)
class Mark:
    source: str
    line: int
    column: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line}:{self.column}"


def config_error(source: str, items: list[str]) -> ConfigError:
    """One ConfigError for every problem of a file: the problem itself when there is one, else
    a count and the first MAX_ERRORS, one per line."""
    if len(items) == 1:
        return ConfigError(items[0])
    shown = "\n  ".join(items[:MAX_ERRORS])
    more = f"\n  ... and {len(items) - MAX_ERRORS} more" if len(items) > MAX_ERRORS else ""
    return ConfigError(f"{source} has {len(items)} errors:\n  {shown}{more}")


class Errors:
    """The problems of one file, each at its position; raised together, in file order."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.located: list[tuple[Mark, str]] = []

    @property
    def items(self) -> list[str]:
        return [
            f"{m}: {msg}" for m, msg in sorted(self.located, key=lambda x: (x[0].line, x[0].column))
        ]

    def mark(self, node: yaml.Node) -> Mark:
        return Mark(self.source, node.start_mark.line + 1, node.start_mark.column + 1)

    def add(self, node: yaml.Node | Mark, message: str) -> None:
        mark = node if isinstance(node, Mark) else self.mark(node)
        self.located.append((mark, message))

    def raise_if_any(self) -> None:
        if self.items:
            raise config_error(self.source, self.items)


MERGE_TAG = STANDARD_TAG + "merge"


def _merged(
    node: yaml.MappingNode, errors: Errors, what: str, inside: frozenset[int] = frozenset()
) -> list[tuple[yaml.Node, yaml.Node]]:
    """The mapping's own pairs after those its merge keys (`<<: *defaults`, YAML 1.1, as
    mig-parted's parser takes them) bring in: an own key wins over a merged one, an earlier
    merged mapping over a later one."""
    own = [(k, v) for k, v in node.value if k.tag != MERGE_TAG]
    taken = {k.value for k, _ in own if isinstance(k, yaml.ScalarNode)}
    merged: list[tuple[yaml.Node, yaml.Node]] = []
    for key, value in node.value:
        if key.tag != MERGE_TAG:
            continue
        sources = value.value if isinstance(value, yaml.SequenceNode) else [value]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                errors.add(source, f"{what}: '<<' merges a mapping, not {kind(source)}")
                continue
            if id(source) in inside | {id(node)}:
                errors.add(source, f"{what}: '<<' merges a mapping into itself")
                continue
            for k, v in _merged(source, errors, what, inside | {id(node)}):
                if isinstance(k, yaml.ScalarNode) and k.value not in taken:
                    taken.add(k.value)
                    merged.append((k, v))
    return merged + own


def mapping(node: yaml.Node, errors: Errors, what: str) -> list[tuple[yaml.Node, yaml.Node]]:
    """The (key, value) pairs of a mapping node, merge keys resolved; reports duplicate and
    non-string keys."""
    if not isinstance(node, yaml.MappingNode):
        errors.add(node, f"{what} must be a mapping, not {kind(node)}")
        return []
    seen: set[str] = set()
    pairs: list[tuple[yaml.Node, yaml.Node]] = []
    for key, value in _merged(node, errors, what):
        if not isinstance(key, yaml.ScalarNode):
            errors.add(key, f"{what} has a key that is not a string")
            continue
        if key.value in seen:
            errors.add(key, f"{what} has key {key.value!r} twice")
            continue
        seen.add(key.value)
        pairs.append((key, value))
    return pairs


def kind(node: yaml.Node) -> str:
    """What a node is, for an error: `a mapping`, `a list`, `empty`, `int '3'`."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    value = scalar(node)
    if value is None:
        return "empty"
    return f"{type(value).__name__} {node.value!r}"


def scalar(node: yaml.Node) -> Any:
    """The plain YAML value of a scalar node (int, bool, str, None...); None for others. A value
    its tag cannot build (`!!int abc`) is its text: `check_tags` has reported it."""
    if not isinstance(node, yaml.ScalarNode):
        return None
    try:
        return yaml.constructor.SafeConstructor().construct_object(node)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError):
        return node.value


def _walk(root: yaml.Node, visit: Callable[[yaml.Node], bool]) -> None:
    """`visit` every node once (aliases share nodes), without recursion; a node's children
    only when `visit` returned True for it."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if not visit(node):
            continue
        if isinstance(node, yaml.MappingNode):
            stack += reversed([part for pair in node.value for part in pair])
        elif isinstance(node, yaml.SequenceNode):
            stack += reversed(node.value)


def check_tags(root: yaml.Node, errors: Errors, what: str = "a MIG config") -> None:
    """Every node once: a tag other than YAML's own (`!custom`) and a scalar its tag cannot
    build (`!!int abc`, `!!timestamp 2001-99-99`) are errors at their position."""

    def visit(node: yaml.Node) -> bool:
        if not node.tag.startswith(STANDARD_TAG):
            errors.add(node, f"tag {node.tag!r} is not allowed in {what}")
            return False
        if isinstance(node, yaml.ScalarNode) and node.tag != MERGE_TAG:
            try:
                yaml.constructor.SafeConstructor().construct_object(node)
            except (yaml.YAMLError, ValueError, TypeError, OverflowError) as err:
                # PyYAML's own problem is in words; int()'s and datetime's are Python's.
                problem = getattr(err, "problem", None)
                errors.add(
                    node,
                    f"{node.value!r} is not a valid {node.tag[len(STANDARD_TAG) :]}"
                    + (f": {problem}" if problem else ""),
                )
        return True

    _walk(root, visit)


def _bounded(root: yaml.Node, source: str) -> None:
    """Raise ConfigError for a tree whose aliases make it larger than a config can be: more
    than MAX_ALIASES aliases, more than MAX_EXPANDED_NODES nodes once every alias is expanded
    (a 'billion laughs': 9 levels of 9 aliases are 10^9 nodes to whoever walks the tree), or
    an alias inside the node it names (a cycle). Iterative: a deep tree is no RecursionError."""
    size: dict[int, int] = {}
    aliases = 0
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_: set[int] = set()
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children = (
            [part for pair in node.value for part in pair]
            if isinstance(node, yaml.MappingNode)
            else node.value
            if isinstance(node, yaml.SequenceNode)
            else []
        )
        if children_done:
            open_.discard(key)
            size[key] = min(1 + sum(size[id(c)] for c in children), MAX_EXPANDED_NODES + 1)
            if size[key] > MAX_EXPANDED_NODES:
                raise ConfigError(
                    f"{source}: its aliases expand it to more than {MAX_EXPANDED_NODES:,} values"
                    " (a 'billion laughs'); write the values out or use fewer aliases"
                )
            continue
        if key in size:  # a node seen before: an alias
            aliases += 1
            if aliases > MAX_ALIASES:
                raise ConfigError(
                    f"{source}: more than {MAX_ALIASES:,} aliases (*name); write the values out"
                )
            continue
        open_.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in open_:
                mark = child.start_mark
                raise ConfigError(
                    f"{source}:{mark.line + 1}:{mark.column + 1}: an alias (*name) inside the"
                    " node it names: the value would hold itself"
                )
            stack.append((child, False))


def compose_document(text: str, source: str) -> yaml.Node | None:
    """`compose` of a file that may be empty (or comments only): None then."""
    try:
        # libyaml when present: ~20x faster than the pure-Python reader, marks kept.
        root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{where}: not valid YAML: {problem}") from err
    except RecursionError as err:
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from err
    if root is not None:
        _bounded(root, source)
    return root


def compose(text: str, source: str, expected: str) -> yaml.Node:
    """The YAML node tree of a config file, with marks: the one YAML reader of nodeagent
    (libyaml where present), bounded in its aliases (`_bounded`). Raises ConfigError (one
    sentence with the position) for text that is not YAML, for aliases that make it too large
    or hold themselves, and for an empty file (`expected` says what a file holds: "'version:
    v1' and 'mig-configs'")."""
    root = compose_document(text, source)
    if root is None:
        raise ConfigError(f"{source}: the file is empty; expected {expected}")
    return root


# The tags a plain document (a kubeconfig, a device plugin config) may carry: YAML's own
# JSON-like types. `!!binary` (bytes), `!!set`, `!!omap`, `!!python/...` and `!custom` build
# values no field of these files takes; they are refused at their position.
PLAIN_TAGS = frozenset(
    STANDARD_TAG + t for t in ("str", "int", "float", "bool", "null", "seq", "map", "merge")
)


def check_plain(root: yaml.Node, errors: Errors, what: str) -> None:
    """Every node once: a tag other than PLAIN_TAGS (and timestamps) is an error at its
    position, and so is a value its tag cannot build (check_tags)."""
    found = len(errors.located)

    def visit(node: yaml.Node) -> bool:
        if node.tag not in PLAIN_TAGS and not node.tag.startswith(STANDARD_TAG + "timestamp"):
            shown = node.tag.replace(STANDARD_TAG, "!!")
            errors.add(node, f"tag {shown!r} is not allowed in {what}")
            return False
        return True

    _walk(root, visit)
    if len(errors.located) == found:
        check_tags(root, errors, what)


def load_plain(text: str, source: str, what: str) -> Any:
    """The plain data (dicts, lists, str, int, float, bool, None) of a YAML document read by
    `compose` (bounded), None for an empty one. Raises ConfigError with the position for text
    that is not YAML, a tag other than PLAIN_TAGS, a value its tag cannot build (`!!int abc`),
    or aliases that make it too large."""
    root = compose_document(text, source)
    if root is None:
        return None
    errors = Errors(source)
    check_plain(root, errors, what)
    errors.raise_if_any()
    return construct(root, source)


def construct(root: yaml.Node, source: str) -> Any:
    """The Python data of a document `compose_document` read (YAML's safe types). Raises
    ConfigError with the position for a value its tag cannot build (`!!int abc`) or a tag
    no safe type has, and for one nested too deeply."""
    constructor = yaml.constructor.SafeConstructor()
    try:
        return constructor.construct_document(root)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise ConfigError(f"{where}: a value cannot be read: {problem}") from err
    except RecursionError as err:
        raise ConfigError(f"{source}: not valid YAML: nested too deeply") from err

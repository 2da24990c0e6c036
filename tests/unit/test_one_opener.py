"""Every input file is opened one way: nodeagent.base.files.read_regular (a regular file, opened
non-blocking, read bounded, a typed error naming the path). Any other open of a file in the
package is a failure naming its file:line, unless it is one of the few listed below, each
with why it is no input."""

from __future__ import annotations

import re
from pathlib import Path

import nodeagent

PACKAGE = Path(nodeagent.__file__).parent
OPENER = PACKAGE / "base" / "files.py"
OPENS = re.compile(
    r"(?<![\w.])open\(|\.open\(|\.read_text\(|\.read_bytes\(|\bos\.fdopen\(|\bio\.open\("
    r"|\bFileIO\(|\bopen_text\(|\bnp\.fromfile\("
)
# (file, text on the line): opens that read no input of the host
ALLOWED = {
    # package data shipped inside the wheel, not a host path
    ("metrics/dcgm.py", 'resources.files("nodeagent.metrics")'),
    ("sim/models.py", 'resources.files("nodeagent.sim")'),
    ("state/recovery.py", 'resources.files("nodeagent.state")'),
    # writes, not reads: stdout to /dev/null, an exec plugin's credential to a private file
    ("cli/commands.py", "os.open(os.devnull, os.O_WRONLY)"),
    ("kube/kubeconfig.py", 'os.fdopen(fd, "w")'),
    # the client key written to a private folder for OpenSSL to check it
    ("kube/kubeconfig_fields.py", "os.O_WRONLY | os.O_CREAT | os.O_EXCL"),
    ("kube/kubeconfig_fields.py", 'os.fdopen(fd, "wb")'),
}


def other_opens(root: Path) -> list[str]:
    """file:line of each open of a file outside the opener and ALLOWED."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == OPENER:
            continue
        relative = path.relative_to(root).as_posix()
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if not OPENS.search(code):
                continue
            if any(relative == f and text in code for f, text in ALLOWED):
                continue
            found.append(f"nodeagent/{relative}:{number}: {line.strip()}")
    return found


def test_no_input_is_opened_but_through_the_one_opener() -> None:
    assert other_opens(PACKAGE) == []


def test_the_grep_finds_each_way_of_opening(tmp_path: Path) -> None:
    lines = [
        'f = open("/etc/x")',
        "data = Path(p).read_text()",
        "data = p.read_bytes()",
        "with path.open() as f:",
        "fd = os.fdopen(3)",
        'io.open("x")',
        "fd = os.open(p, os.O_RDONLY)",
        "# open( in a comment is no open",
    ]
    (tmp_path / "mod.py").write_text("\n".join(lines) + "\n")
    found = other_opens(tmp_path)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "4", "5", "6", "7"]
    assert found[0] == 'nodeagent/mod.py:1: f = open("/etc/x")'


YAML_READS = re.compile(
    r"\byaml\.(safe_load|load|full_load|unsafe_load|safe_load_all|load_all|full_load_all"
    r"|unsafe_load_all|compose|compose_all|parse|scan)\("
)
YAML_READER = PACKAGE / "base" / "configfile.py"


def yaml_reads(root: Path, reader: Path) -> list[str]:
    """file:line of each YAML read outside the one reader (its alias and size bounds)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path == reader:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if YAML_READS.search(line.split("#", 1)[0]):
                found.append(f"nodeagent/{path.relative_to(root).as_posix()}:{number}")
    return found


def test_no_yaml_is_read_but_through_the_one_reader() -> None:
    """Issue 39 class 4: every YAML input (settings, MIG and sharing configs, hooks, the
    kubeconfig, the device plugin's config) goes through base/configfile.py's reader."""
    assert yaml_reads(PACKAGE, YAML_READER) == []


def test_the_yaml_grep_finds_each_way_of_reading(tmp_path: Path) -> None:
    lines = ["yaml.safe_load(text)", "yaml.load(t, Loader=L)", "yaml.compose(t)",
             "list(yaml.safe_load_all(t))", "# yaml.safe_load( in a comment", "yaml.dump(x)"]  # fmt: skip
    (tmp_path / "mod.py").write_text("\n".join(lines) + "\n")
    assert [f.split(":")[1] for f in yaml_reads(tmp_path, tmp_path / "none.py")] == [
        "1", "2", "3", "4"
    ]  # fmt: skip

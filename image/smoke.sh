#!/bin/sh
# Runs inside the built image (image/build.sh copies it in): the CLI and the agent on the
# emulator, as the image's default user. Usage: smoke.sh PORT
set -eu
port=$1

uid=$(id -u)
echo "smoke: user $(id -un 2>/dev/null || echo "?") (uid $uid), $(nodeagent --version)"
if [ "$uid" = 0 ]; then echo "smoke: the image's default user is root" >&2; exit 1; fi

echo "smoke: nodeagent --simulate h200 status"
nodeagent --simulate h200 status

# The Kubernetes client loads and a missing kubeconfig is one sentence, exit 2.
set +e
out=$(NODE_NAME=smoke KUBECONFIG=/nonexistent/config nodeagent --simulate h200 run --kube 2>&1)
rc=$?
set -e
echo "smoke: run --kube without a kubeconfig: exit $rc: $out"
[ "$rc" = 2 ] || exit 1

echo "smoke: nodeagent --simulate h200x2 run --metrics-address 127.0.0.1:$port"
nodeagent --simulate h200x2 run --metrics-address "127.0.0.1:$port" &
agent=$!
trap 'kill -KILL "$agent" 2>/dev/null || :' EXIT
python3 - "$port" "$agent" <<'EOF'
"""Scrape /metrics once the agent is ready (/readyz 200: its first reconcile done; /metrics
answers before that, with what is known): both emulated GPUs must appear."""
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

url = f"http://127.0.0.1:{sys.argv[1]}/metrics"
ready = f"http://127.0.0.1:{sys.argv[1]}/readyz"
deadline = time.monotonic() + 60
while True:
    try:  # a 503 from /readyz is an HTTPError, an OSError: not yet
        with urllib.request.urlopen(ready, timeout=5):
            pass
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        break
    except OSError as err:
        stat = Path(f"/proc/{sys.argv[2]}/stat")
        if not stat.exists() or stat.read_text().rpartition(")")[2].split()[0] == "Z":
            sys.exit("smoke: the agent exited before it was ready")
        if time.monotonic() > deadline:
            sys.exit(f"smoke: {ready} was not 200 in 60 s: {err}")
        time.sleep(0.2)
families = {f.name: f for f in text_string_to_metric_families(text)}
info = families.get("nodeagent_gpu_info")
gpus = sorted(s.labels["uuid"] for s in info.samples) if info else []
samples = sum(len(f.samples) for f in families.values())
print(f"smoke: /metrics: {len(families)} families, {samples} samples, {len(gpus)} GPUs in nodeagent_gpu_info")
if len(gpus) != 2:
    sys.exit("smoke: expected the 2 emulated GPUs in nodeagent_gpu_info")
EOF
kill -TERM "$agent"
set +e
wait "$agent"
rc=$?
set -e
echo "smoke: agent stopped on SIGTERM, exit $rc"
[ "$rc" = 0 ]

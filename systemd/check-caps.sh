#!/bin/bash
# On a GPU host, as root: does MPS work under nodeagent.service's capability bounding set, and
# which of its capabilities does it need? A private MPS control daemon (pipe and log folders in
# a temporary folder; no compute-mode, MIG or clock change) is started under the unit's set,
# then under the set less one capability each time; each time a CUDA client (torch) runs through
# it as an unprivileged user (65534). Prints one line per run and the daemon's and server's RSS.
#   sudo systemd/check-caps.sh            (needs setpriv, nvidia-cuda-mps-control, python3+torch)
set -u
CAPS=${CAPS:-sys_admin,setuid,setgid,kill}
CLIENT_UID=${CLIENT_UID:-65534}
PY=${PYTHON:-python3}
for tool in setpriv nvidia-cuda-mps-control "$PY"; do
    command -v "$tool" >/dev/null || { echo "check-caps: $tool is missing" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "check-caps: run as root" >&2; exit 2; }

rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null; }

one() { # LABEL CAPLIST: start a daemon under CAPLIST, run the client, report, quit
    local label=$1 caps=$2 dir pid out rc servers server_uid=- server_rss=- daemon_rss=-
    dir=$(mktemp -d)
    mkdir -p "$dir/pipe" "$dir/log"
    chmod 0755 "$dir" "$dir/pipe" "$dir/log"
    local bset="-all"
    [ -n "$caps" ] && bset="-all,+${caps//,/,+}"
    CUDA_MPS_PIPE_DIRECTORY=$dir/pipe CUDA_MPS_LOG_DIRECTORY=$dir/log \
        setpriv --bounding-set "$bset" --no-new-privs nvidia-cuda-mps-control -d
    sleep 1
    pid=$(cat "$dir/pipe/nvidia-cuda-mps-control.pid" 2>/dev/null || pgrep -n -f "nvidia-cuda-mps-control -d")
    out=$(CUDA_MPS_PIPE_DIRECTORY=$dir/pipe HOME=/tmp timeout 120 \
        setpriv --reuid "$CLIENT_UID" --regid "$CLIENT_UID" --clear-groups \
        "$PY" -c 'import torch; x = torch.ones(2048, 2048, device="cuda"); print(int((x @ x)[0, 0].item()))' 2>&1)
    rc=$?
    servers=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$dir/pipe timeout 10 nvidia-cuda-mps-control 2>/dev/null | tr '\n' ' ')
    for s in $servers; do
        server_uid=$(awk '/^Uid:/ {print $2}' "/proc/$s/status" 2>/dev/null)
        server_rss=$(rss_kib "$s")
    done
    [ -n "$pid" ] && daemon_rss=$(rss_kib "$pid")
    printf '%-22s client rc=%s out=%s | daemon pid=%s rss=%s KiB | servers=%s uid=%s rss=%s KiB\n' \
        "$label" "$rc" "$(echo "$out" | tail -1 | cut -c1-120)" "${pid:-none}" "$daemon_rss" "${servers:-none}" "$server_uid" "$server_rss"
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$dir/pipe timeout 20 nvidia-cuda-mps-control >/dev/null 2>&1
    sleep 2
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
    for s in $servers; do kill -9 "$s" 2>/dev/null; done
    if [ "$rc" != 0 ]; then tail -5 "$dir/log/control.log" 2>/dev/null | sed 's/^/    control.log: /'; fi
    rm -rf "$dir"
}

one "unit set ($CAPS)" "$CAPS"
IFS=, read -r -a all <<<"$CAPS"
for drop in "${all[@]}"; do
    rest=$(printf '%s\n' "${all[@]}" | grep -vx "$drop" | paste -sd, -)
    one "without $drop" "$rest"
done
one "no capabilities" ""

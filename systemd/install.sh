#!/bin/sh
# Install nodeagent as a systemd service: a venv under PREFIX, its settings file under
# /etc/nodeagent (an existing one is never overwritten), the unit, enabled.
#
#   sudo systemd/install.sh                                   # pip installs this checkout
#   sudo NODEAGENT_SOURCE='nodeagent==0.1.0' systemd/install.sh   # or anything pip takes
#   sudo systemctl start nodeagent                            # after editing the settings
#
# PREFIX     the venv (default /opt/nodeagent; the unit's ExecStart follows it)
# DESTDIR    a staging root ('' : /): files go under it, and the unit is enabled offline
#            (systemctl --root) when systemctl exists
# PYTHON     the interpreter the venv is made from (default python3, >= 3.10)
# PIP_ARGS   extra pip arguments (e.g. --no-index --find-links DIR for an offline install)
# ENABLE     0: install without enabling
set -eu

here=$(cd "$(dirname "$0")" && pwd)
PREFIX=${PREFIX:-/opt/nodeagent}
DESTDIR=${DESTDIR:-}
PYTHON=${PYTHON:-python3}
PIP_ARGS=${PIP_ARGS:-}
ENABLE=${ENABLE:-1}
SOURCE=${NODEAGENT_SOURCE:-$(dirname "$here")}
etc=$DESTDIR/etc
unit=$etc/systemd/system/nodeagent.service

say() { printf 'install-systemd: %s\n' "$*"; }
fail() { printf 'install-systemd: %s\n' "$*" >&2; exit 2; }

case $PREFIX in
/*) ;;
*) fail "PREFIX must be an absolute path, not '$PREFIX'" ;;
esac
case $PREFIX in
*[!A-Za-z0-9/._-]*) fail "PREFIX may hold only letters, digits and / . _ -, not '$PREFIX'" ;;
esac
command -v "$PYTHON" >/dev/null 2>&1 || fail "no $PYTHON here: set PYTHON to a Python >= 3.10"

say "venv $DESTDIR$PREFIX, pip install $SOURCE"
"$PYTHON" -m venv "$DESTDIR$PREFIX"
# shellcheck disable=SC2086 # PIP_ARGS is a list of arguments
"$DESTDIR$PREFIX/bin/python" -m pip install --quiet --upgrade $PIP_ARGS "$SOURCE"
if [ -n "$DESTDIR" ]; then
    # pip wrote the staging path into its scripts' shebangs: they must name where the venv runs
    # once the staged tree is in place ($PREFIX/bin/python), or ExecStart fails with 203/EXEC.
    for script in "$DESTDIR$PREFIX"/bin/*; do
        if [ -f "$script" ] && [ ! -L "$script" ] && head -c 2 "$script" | grep -q '^#!'; then
            sed -i "1s|^#!$DESTDIR$PREFIX/|#!$PREFIX/|" "$script"
        fi
    done
fi

install -d -m 0755 "$etc/nodeagent" "$etc/default" "$etc/systemd/system"
keep_or_install() { # SOURCE DEST: a file the admin edits is theirs once it exists
    if [ -e "$2" ]; then
        say "kept $2 (exists; the shipped one is $1)"
    else
        install -m 0644 "$1" "$2"
        say "wrote $2"
    fi
}
keep_or_install "$here/nodeagent.yaml" "$etc/nodeagent/nodeagent.yaml"
keep_or_install "$here/nodeagent.env" "$etc/default/nodeagent"

sed "s|/opt/nodeagent/|$PREFIX/|g" "$here/nodeagent.service" >"$unit.tmp"
chmod 0644 "$unit.tmp"
mv -f "$unit.tmp" "$unit"
say "wrote $unit (ExecStart $PREFIX/bin/nodeagent)"

if [ "$ENABLE" != 1 ]; then
    say "not enabled (ENABLE=$ENABLE): systemctl enable --now nodeagent"
elif [ -z "$DESTDIR" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    systemctl enable nodeagent.service
    say "enabled: edit $etc/nodeagent/nodeagent.yaml, then systemctl start nodeagent"
elif command -v systemctl >/dev/null 2>&1; then
    # No running systemd (a staging root, a container, an image build): link it as
    # `systemctl enable` would; the unit starts at the next boot.
    systemctl --root="${DESTDIR:-/}" enable nodeagent.service
    say "enabled under ${DESTDIR:-/} (systemd is not running here)"
else
    say "no systemctl here: enable it where systemd runs (systemctl enable --now nodeagent)"
fi

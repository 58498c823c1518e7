#!/usr/bin/env bash
# Install the locked Node packages from the npm registry and compile: what CI and the
# conformance tests run. `npm ci` runs only when package-lock.json changed since the last
# install (a stamp in node_modules), so a rerun takes about as long as tsc. Exit status 3:
# no node/npm; 4: `npm ci` failed (the tests skip on both); anything else: tsc failed.
set -euo pipefail
cd "$(dirname "$0")"
command -v node >/dev/null 2>&1 || { echo "build.sh: node is not installed" >&2; exit 3; }
command -v npm >/dev/null 2>&1 || { echo "build.sh: npm is not installed" >&2; exit 3; }
stamp=node_modules/.fleet-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    npm ci --no-audit --no-fund --loglevel=error || { echo "build.sh: npm ci failed (is the npm registry reachable?)" >&2; exit 4; }
    echo "$want" > "$stamp"
fi
npx --no-install tsc -p .

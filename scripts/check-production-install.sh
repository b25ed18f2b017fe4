#!/usr/bin/env bash
# A production install, as an operator makes one: the tree copied somewhere
# new, `npm ci --omit=dev`, then `npx gateway serve` (no demo, no secret on
# stdout) and `npm start` (the demo), each on the pinned Node 24 whatever the
# system Node is. Run by .ci/run after the tests; stops everything it starts.
set -euo pipefail
cd "$(dirname "$0")/.."

work="$(mktemp -d)"
pid=""
cleanup() {
  if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$work/"
cd "$work"
npm ci --omit=dev --no-audit --no-fund --prefer-offline >"$work/npm.log" 2>&1 || { cat "$work/npm.log"; exit 1; }
if [ -e node_modules/vitest ] || [ -e node_modules/@bufbuild/buf ]; then echo "production install: dev dependencies were installed" >&2; exit 1; fi

# Starts `$@` in the background, waits for its listening line, and sets $base.
start() {
  : >"$work/out.log"
  GATEWAY_DATA_DIR="$work/data" GATEWAY_PORT=0 "$@" >"$work/out.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do
    base="$(grep -o 'listening on http://[0-9.:]*' "$work/out.log" | head -1 | cut -d' ' -f3 || true)"
    [ -n "$base" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.3
  done
  echo "production install: '$*' did not start:" >&2
  cat "$work/out.log" >&2
  exit 1
}

# Stops the gateway started last as a supervisor would: SIGTERM to the
# process it started (npm or npx), then the gateway must say it stopped and
# leave no process behind.
stop() {
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
  for _ in $(seq 1 50); do grep -q '"msg":"stopped"' "$work/out.log" && break; sleep 0.2; done
  if ! grep -q '"msg":"stopped"' "$work/out.log"; then echo "production install: the gateway did not stop after SIGTERM:" >&2; cat "$work/out.log" >&2; exit 1; fi
  if curl -s -o /dev/null "$base/healthz"; then echo "production install: the gateway still answers on $base after SIGTERM" >&2; exit 1; fi
}

start npx gateway serve
curl -fsS "$base/readyz" >/dev/null
node_version="$(curl -fsS "$base/metrics" | grep -o 'nodejs_version_info{version="v[0-9]*' | grep -o '[0-9]*$')"
if [ "$node_version" -lt 24 ]; then echo "production install: the gateway runs on Node $node_version, not the pinned 24" >&2; exit 1; fi
if grep -qi 'secret' "$work/out.log"; then echo "production install: gateway serve printed a secret:" >&2; cat "$work/out.log" >&2; exit 1; fi
if curl -fsS "$base/console/" 2>/dev/null | grep -q '<html'; then echo "production install: gateway serve serves the console without GATEWAY_CONSOLE=on" >&2; exit 1; fi
stop
echo "production install: npm ci --omit=dev, npx gateway serve on Node $node_version: ready, no secret printed, no console, clean stop"

# The import's worker threads load from the production install alone.
npm run -s demo:ndjson >"$work/demo.ndjson"
imported="$(GATEWAY_DATA_DIR="$work/import-data" npx gateway import "$work/demo.ndjson" --json --workers 2)"
echo "$imported" | grep -q '"skipped":\[\]' && ! echo "$imported" | grep -q '"imported":0,' || { echo "production install: gateway import failed: $imported" >&2; exit 1; }
echo "production install: gateway import with two worker threads: $(echo "$imported" | grep -o '"imported":[0-9]*') records"

# The console builds from the production install alone (esbuild, connect-web and uPlot are dependencies).
GATEWAY_CONSOLE=on start npx gateway serve
curl -fsS "$base/console/" | grep -q '<script type="module" src="app.js">' || { echo "production install: GATEWAY_CONSOLE=on serves no console page" >&2; exit 1; }
[ "$(curl -fsS "$base/console/app.js" | wc -c)" -gt 10000 ] || { echo "production install: the console bundle is missing" >&2; exit 1; }
curl -fsS "$base/console/sign.js" | grep -q 'GATEWAY-HMAC-SHA256' || { echo "production install: /console/sign.js is missing" >&2; exit 1; }
stop
echo "production install: GATEWAY_CONSOLE=on serves the console and sign.js"

start npm start
for _ in $(seq 1 50); do grep -q 'Demo account' "$work/out.log" && break; sleep 0.2; done
grep -q 'Demo account' "$work/out.log" || { echo "production install: npm start printed no demo account" >&2; cat "$work/out.log" >&2; exit 1; }
curl -fsS "$base/healthz" >/dev/null
stop
echo "production install: npm start serves the demo"

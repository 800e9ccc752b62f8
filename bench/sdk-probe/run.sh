#!/bin/sh
# Does the proxy-wasm Rust SDK deliver the answer of a call made in a
# stream's callback once that stream has ended? (docs/development.md, "the
# proxy-wasm SDK".) Builds ../sdk and ../raw, runs each in its own Envoy
# (.deps/bin/envoy, one worker) whose route answers at once (direct_response)
# and whose gRPC cluster `rls` points at a port nothing listens on (every call
# fails fast, UNAVAILABLE), sends N requests that go on at once and N/5 that
# wait for their answer, and prints the probe's counters.
#
#   sh bench/sdk-probe/run.sh [N]      (from the repository's root; default 100)
set -eu
N=${1:-100}
root=$(pwd)
envoy=$root/.deps/bin/envoy
out=$root/target/sdk-probe
mkdir -p "$out"
for probe in sdk raw; do
  cargo build -q --release --target wasm32-wasip1 \
    --manifest-path "bench/sdk-probe/$probe/Cargo.toml" --target-dir "$out/$probe"
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
for probe in sdk raw; do
  wasm=$(ls "$out/$probe"/wasm32-wasip1/release/*.wasm)
  listen=$(free_port); admin=$(free_port); dead=$(free_port)
  sed -e "s#@WASM@#$wasm#; s#@LISTEN@#$listen#; s#@ADMIN@#$admin#; s#@DEAD@#$dead#" \
    bench/sdk-probe/envoy.yaml.in > "$out/$probe.yaml"
  "$envoy" -c "$out/$probe.yaml" --disable-hot-restart --concurrency 1 --base-id-path "$out/$probe.base-id" \
    --use-dynamic-base-id > "$out/$probe.log" 2>&1 &
  pid=$!
  i=0
  until curl -sf -o /dev/null "http://127.0.0.1:$admin/ready"; do
    i=$((i + 1)); [ $i -lt 100 ] || { kill "$pid"; echo "$probe: Envoy not ready" >&2; exit 1; }
    sleep 0.1
  done
  for _ in $(seq "$N"); do curl -s -o /dev/null "http://127.0.0.1:$listen/go"; done
  if [ "$probe" = sdk ]; then
    for _ in $(seq $((N / 5))); do curl -s -o /dev/null "http://127.0.0.1:$listen/pause"; done
  fi
  # Every call fails within connect_timeout (1 s) at the latest.
  sleep 2
  echo "$probe:"; curl -s "http://127.0.0.1:$admin/stats?filter=wasmcustom" | sed 's/^/  /'
  kill "$pid"; wait "$pid" || true
done

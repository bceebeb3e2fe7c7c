#!/bin/sh
# A stand-in SGLang server for images that must build anywhere (FROM scratch + static busybox): it prints
# SGLang 0.5.23's start-up log (docs/smoke.md: server_args, per-rank lines with `[time TPn]` prefixes,
# carriage-return checkpoint bars from several rank processes at once, uvicorn's lines), then serves
# /health (503 during warm-up), /v1/models and POST /v1/completions through busybox nc + handler.sh.
#
# Accepts SGLang's flags (--model-path --tp --host --port; others are ignored) or the environment:
#   PORT (30000)  HOST (127.0.0.1)  MODEL_PATH  TP (2)  DEMO_SCENARIO (healthy)  STEP_S (0.05)  WARMUP_S (0.3)
# DEMO_SCENARIO: healthy | incident (bars reach N/N, then silence) | crash-no-kernel-image | health-503
#
# Why nc and not `httpd -f -p PORT -h www` with CGI: busybox httpd (1.35) runs CGI only for /cgi-bin/* or
# suffix-mapped paths; /health and /v1/completions reach a CGI only by a 302 to a directory URL, which
# turns the POST of a completion into a GET without its body. nc -ll -e gives every request, method and
# body intact, to handler.sh. (busybox nc cannot bind one address: it listens on every interface.)
set -u

PORT=${PORT:-30000}
HOST=${HOST:-127.0.0.1}
MODEL_PATH=${MODEL_PATH:-/models/demo}
TP=${TP:-2}
DEMO_SCENARIO=${DEMO_SCENARIO:-healthy}
STEP_S=${STEP_S:-0.05}
WARMUP_S=${WARMUP_S:-0.3}
SHARDS=${SHARDS:-16}

while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT=$2; shift 2 ;;
    --host) HOST=$2; shift 2 ;;
    --model-path) MODEL_PATH=$2; shift 2 ;;
    --tp|--tp-size) TP=$2; shift 2 ;;
    --scenario) DEMO_SCENARIO=$2; shift 2 ;;
    --*=*) shift ;;
    --*) if [ $# -gt 1 ] && [ "${2#--}" = "$2" ]; then shift 2; else shift; fi ;;
    *) shift ;;
  esac
done

here=$(cd "$(dirname "$0")" && pwd)
DEMO_STATE=${TMPDIR:-/tmp}/bwstack-demo-$$
mkdir -p "$DEMO_STATE"
# the state folder goes with the server, however it ends (SIGTERM's trap below exits through this one);
# background rank subshells do not inherit an EXIT trap, so a rank that finishes leaves it in place
trap 'rm -rf "$DEMO_STATE"' EXIT
echo starting >"$DEMO_STATE/health"
export DEMO_STATE MODEL_PATH

stamp() { date '+%Y-%m-%d %H:%M:%S'; }
say() { printf '[%s] %s\n' "$(stamp)" "$*" >&2; }
rank_say() { r=$1; shift; printf '[%s TP%s] %s\n' "$(stamp)" "$r" "$*" >&2; }
# asleep, but woken by a signal: a foreground sleep would hold a trap back for an hour
sleeper=""
forever() { while :; do sleep 3600 & sleeper=$!; wait "$sleeper"; done; }

# SIGTERM to the server alone (not to its process group, as smoke sends it): stop the ranks, nc and the
# sleep by their pids (`$(jobs -p)` runs in a subshell, which has no jobs), then leave through the EXIT trap
pids=""
nc_pid=""
trap 'kill $pids $nc_pid $sleeper 2>/dev/null; exit 143' TERM INT

rank() {
  r=$1
  trap 'kill $sleeper 2>/dev/null; exit 143' TERM INT  # this rank's own sleep goes with it
  rank_say "$r" "Init parallel begin."
  sleep "$STEP_S"
  rank_say "$r" "Init parallel ends. elapsed=0.05 s"
  rank_say "$r" "Load weight begin. avail mem=93.72 GB"
  label="Loading safetensors checkpoint shards"
  i=0
  while [ "$i" -le "$SHARDS" ]; do
    printf '\r%s: %3d%% Completed | %d/%d [00:%02d<00:00,  2.55it/s]' "$label" $((100 * i / SHARDS)) "$i" "$SHARDS" "$i" >&2
    sleep 0.01
    i=$((i + 1))
  done
  printf '\r%s: 100%% Completed | %d/%d [00:%02d<00:00,  2.55it/s]\n' "$label" "$SHARDS" "$SHARDS" "$SHARDS" >&2
  [ "$DEMO_SCENARIO" = incident ] && forever
  rank_say "$r" "Load weight end. elapsed=0.70 s, type=DeepseekV3ForCausalLM, avail mem=67.18 GB, mem usage=26.54 GB."
  rank_say "$r" "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1048576, KV size: 17.04 GB"
  rank_say "$r" "Memory pool end. avail mem=48.92 GB"
  rank_say "$r" "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=48.90 GB"
  if [ "$DEMO_SCENARIO" = crash-no-kernel-image ] && [ "$r" = 0 ]; then
    rank_say "$r" "Scheduler hit an exception: Traceback (most recent call last):"
    echo "RuntimeError: CUDA error: no kernel image is available for execution on the device" >&2
    exit 1
  fi
  sleep "$STEP_S"
  rank_say "$r" "Capture target decode CUDA graph end. bs=[1, 2, 4, 8], elapsed=0.05 s, mem usage=0.31 GB, avail mem=48.59 GB."
  rank_say "$r" "max_total_num_tokens=1048576, chunked_prefill_size=8192, max_running_requests=2048, context_len=262144"
}

say "server_args={'model_path': '$MODEL_PATH', 'tp_size': $TP, 'host': '$HOST', 'port': $PORT, 'speculative_algorithm': None}"
r=0
while [ "$r" -lt "$TP" ]; do
  rank "$r" &
  pids="$pids $!"
  r=$((r + 1))
done
for pid in $pids; do
  if ! wait "$pid"; then
    say "Received sigquit from a child process. It usually means the child failed."
    kill $pids 2>/dev/null
    exit 1
  fi
done

printf 'INFO:     Started server process [%s]\nINFO:     Waiting for application startup.\n' $$ >&2
printf 'INFO:     Application startup complete.\n' >&2
nc -ll -p "$PORT" -e "$here/handler.sh" &
nc_pid=$!
sleep 0.1
printf 'INFO:     Uvicorn running on http://%s:%s (Press CTRL+C to quit)\n' "$HOST" "$PORT" >&2
sleep "$WARMUP_S"
if [ "$DEMO_SCENARIO" != health-503 ]; then
  echo ok >"$DEMO_STATE/health"
  say "The server is fired up and ready to roll!"
fi
forever

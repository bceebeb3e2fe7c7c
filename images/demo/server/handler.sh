#!/bin/sh
# One HTTP request on stdin/stdout (busybox nc -e): GET /health, GET /v1/models, POST /v1/completions.
# The access line goes to stderr, the container's log, in uvicorn's shape.
read -r method path _ || exit 0
path=$(printf '%s' "$path" | tr -d '\r')
length=0
while IFS= read -r header; do
  header=$(printf '%s' "$header" | tr -d '\r')
  [ -z "$header" ] && break
  case "$header" in
    [Cc]ontent-[Ll]ength:*) length=$(printf '%s' "${header#*:}" | tr -d ' ') ;;
  esac
done
body=""
[ "$length" -gt 0 ] 2>/dev/null && body=$(head -c "$length")

reply() {
  printf 'HTTP/1.1 %s\r\nContent-Type: application/json\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s' \
    "$1" "${#2}" "$2"
  printf 'INFO:     127.0.0.1 - "%s %s HTTP/1.1" %s\n' "$method" "$path" "${1%% *}" >&2
}

model=${MODEL_PATH:-/models/demo}
case "$method $path" in
  "GET /health")
    if [ "$(cat "$DEMO_STATE/health" 2>/dev/null)" = ok ]; then reply "200 OK" "{}"
    else reply "503 Service Unavailable" '{"detail":"server is starting"}'; fi ;;
  "GET /v1/models")
    reply "200 OK" "{\"object\":\"list\",\"data\":[{\"id\":\"$model\",\"object\":\"model\",\"owned_by\":\"sglang\"}]}" ;;
  "POST /v1/completions")
    case "$body" in *France*) text=" Paris." ;; *) text=" a demo reply" ;; esac
    reply "200 OK" "{\"id\":\"cmpl-demo\",\"object\":\"text_completion\",\"model\":\"$model\",\"choices\":[{\"index\":0,\"text\":\"$text\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":6,\"completion_tokens\":2,\"total_tokens\":8}}" ;;
  *)
    reply "404 Not Found" '{"detail":"Not Found"}' ;;
esac

#!/usr/bin/env bash
# The streaming server under the load generator on this machine, everything they write packed in one archive.
#
#   benchmarks/experiments/serve_under_load.sh OUT_DIR TAG [server key=value ...] [-- loadtest key=value ...]
#   benchmarks/experiments/serve_under_load.sh "$OUT" bf16 dtype=bfloat16 -- 'clients_sweep=[1000,2000]'
#
# Starts the server with its engine-loop trace (benchmarks/experiments/serve_loop_trace.py: one line a second of
# cycles, pushes, push lag, chunk latency, backlog, CPU and GC time) on 127.0.0.1:$PORT, waits for /ready, runs
# `nemo-fastdecode loadtest` against it, samples the server with py-spy for $SPY_SECONDS s once $SPY_STREAMS streams are
# open (when py-spy is installed), stops the server with SIGINT (its graceful shutdown) and packs the trace, the logs,
# the profile and the load test's JSON, Markdown and plot into OUT_DIR/serve_TAG.tar.gz.
# TRACE=0 runs the server as users do (`python3 -m fastdecode_lab serve`: the console script with the lab's synthetic
# model names; no trace and its cost); py-spy then starts
# $SPY_DELAY s (default 15) after the load test.
# Defaults: the 17 x 512 hybrid at [70, 1] with 2,048 slots and 4 network workers; 8 client processes streaming
# binary PCM of 15/14/13/12 s synthetic inputs, starts over 5 s. Later key=value arguments override them.
# INPUT_RATES="16000 24000" runs one load test per client input rate against the same server (tags get _RATEHz).
set -uo pipefail
out=${1:?OUT_DIR}; tag=${2:?TAG}; shift 2
server=(); load=()
while (($#)); do
  if [[ $1 == -- ]]; then shift; load=("$@"); break; fi
  server+=("$1"); shift
done
port=${PORT:-8765}
work=$(mktemp -d)
start=$(date +%s)
note() { echo "[$(($(date +%s) - start)) s] $*" | tee -a "$work/timeline.txt"; }

if [[ ${TRACE:-1} == 0 ]]; then
  serve=(python3 -m fastdecode_lab serve)
else
  serve=(python3 benchmarks/experiments/serve_loop_trace.py "$work/trace.txt")
fi
"${serve[@]}" model=hybrid-17x512-streaming slots=2048 'att_context_size=[70,1]' network_workers=4 port="$port" \
  "${server[@]}" >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 300); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/ready', timeout=1)" 2>/dev/null && break
  kill -0 $server_pid 2>/dev/null || break
  sleep 1
done
note "server ready (pid $server_pid)"

spy_pid=
if command -v py-spy >/dev/null; then
  (if [[ ${TRACE:-1} == 0 ]]; then
     sleep "${SPY_DELAY:-15}"
   else
     for _ in $(seq 600); do  # the trace's 12th column: open streams
       open=$(tail -1 "$work/trace.txt" 2>/dev/null | awk '{print $12}')
       [[ $open =~ ^[0-9]+$ ]] && ((open >= ${SPY_STREAMS:-1800})) && break
       sleep 1
     done
   fi
   timeout 60 py-spy record --pid $server_pid -d "${SPY_SECONDS:-12}" -r 50 -f raw --threads --nonblocking \
     -o "$work/py-spy.txt" >"$work/py-spy.log" 2>&1) &
  spy_pid=$!
fi

for rate in ${INPUT_RATES:-16000}; do  # one load test per client input rate, one after the other, same server
  suffix=$([[ -n ${INPUT_RATES:-} ]] && echo "_${rate}Hz")
  python3 -m fastdecode_lab loadtest url="ws://127.0.0.1:$port/v1/realtime" model=hybrid-17x512-streaming \
    'att_context_size=[70,1]' processes=8 binary=true 'synthetic_seconds=[15.0,14.0,13.0,12.0]' stagger_seconds=5.0 \
    input_rate="$rate" output_dir="$work" tag="$tag$suffix" "${load[@]}" >"$work/loadtest$suffix.log" 2>&1
  note "load test ($rate Hz) exit $?"
done

[[ -n $spy_pid ]] && kill $spy_pid 2>/dev/null
kill -INT $server_pid 2>/dev/null
for _ in $(seq 60); do kill -0 $server_pid 2>/dev/null || break; sleep 1; done
kill -9 $server_pid 2>/dev/null
wait
note "server stopped"
mkdir -p "$out"
tar czf "$out/serve_$tag.tar.gz" -C "$work" .
rm -rf "$work"

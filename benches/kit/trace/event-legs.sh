#!/bin/bash
# Where an event of a long stream waits on its way through a proxy: runs the streams
# comparison for one proxy (9,000 HTTP/2 streams, pinned: the proxy alone on CPU 0), and in
# its steady window records 10 s of the socket system calls of the proxy, the upstream and
# the clients with perf's syscall tracepoints, with `ss` naming which descriptors are the
# two ends of one connection. event_legs.py then splits each event's delay into three
# legs: upstream write -> proxy read, proxy read -> proxy write (on the client connection
# the stream rides), proxy write -> client read.
#
#   benches/kit/trace/event-legs.sh grid|nginx OUT_DIR
#
# Root (perf tracepoints), `ulimit -n 20000`, release binaries built. Tracing costs the
# processes CPU: the run's own table row is not a measurement.
set -euo pipefail
target=$1
out=$2
mkdir -p "$out"
cd "$(dirname "$0")/../../.."
./target/release/grid-proxy-compare --streams --only "$target" --client h2 \
  --stream-counts 9000 --stream-seconds 40 --pin > "$out/table.txt" 2> "$out/table.err" &
compare=$!
# The direct run's row is printed when it ends; the proxy's streams open about then.
for _ in $(seq 1 200); do
  grep -q "9000 | direct" "$out/table.txt" 2> /dev/null && break
  sleep 1
done
sleep 10
case $target in
  grid) proxy=$(pgrep -f grid-gatewayd | paste -sd,) ;;
  nginx) proxy=$(pgrep -x nginx | paste -sd,) ;;
  *) echo "grid or nginx" >&2; exit 2 ;;
esac
pids="$proxy,$(pgrep -f grid-proxy-compare | paste -sd,),$(pgrep -f grid-ticking-upstream | paste -sd,)"
events=syscalls:sys_enter_recvfrom,syscalls:sys_enter_read,syscalls:sys_enter_readv,syscalls:sys_enter_recvmsg
events=$events,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_sendto,syscalls:sys_enter_sendmsg
perf record -q -o "$out/perf.data" -p "$pids" -e "$events" -- sleep 10 2> "$out/perf.err" &
recording=$!
sleep 5
ss -tnpH > "$out/ss.txt"
wait $recording
wait $compare
perf script -F comm,pid,tid,time,event,trace -i "$out/perf.data" > "$out/perf.txt" 2> /dev/null
python3 benches/kit/trace/event_legs.py "$out" | tee "$out/legs.txt"

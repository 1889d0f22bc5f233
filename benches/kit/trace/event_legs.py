#!/usr/bin/env python3
"""The three legs of each event through a proxy, from event-legs.sh's recording.

Reads DIR/perf.txt (`perf script -F comm,pid,tid,time,event,trace` of socket system calls)
and DIR/ss.txt (`ss -tnpH` taken during the recording: which process holds each end of
each connection, its process named `grid-ticking-up` for the upstream, `grid-proxy-comp`
for the clients, anything else the proxy). Prints, each as p50 / p90 / p99 / p99.9:

1. upstream write -> proxy read: each read by the proxy of an upstream connection, less
   the upstream's latest write on the other end of it;
2. proxy read -> proxy write: each such read to the proxy's next write on the client
   connection that stream's events go out on (the connection whose next write after the
   stream's reads comes soonest, by median: a stream rides one connection);
3. proxy write -> client read: each write by the proxy on a client connection to the
   client's next read of it.

One read or write per event on loopback at this rate (the counts say so); a gap over
250 ms is not an event's and is left out.
"""
import bisect
import collections
import re
import sys

LINE = re.compile(r'^\s*(.+?)\s+(\d+)/(\d+)\s+([\d.]+):\s+syscalls:sys_enter_(\w+):\s*(.*)$')
READS = ('read', 'recvfrom', 'recvmsg', 'readv')
WRITES = ('write', 'writev', 'sendto', 'sendmsg')
LONGEST = 0.25


def main(d):
    reads, writes = collections.defaultdict(list), collections.defaultdict(list)
    for line in open(f'{d}/perf.txt', errors='replace'):
        m = LINE.match(line)
        fd = m and re.search(r'\bfd: (0x[0-9a-f]+)', m.group(6))
        if not fd:
            continue
        key, ts, name = (int(m.group(2)), int(fd.group(1), 16)), float(m.group(4)), m.group(5)
        if name in READS:
            reads[key].append(ts)
        elif name in WRITES:
            writes[key].append(ts)
    for times in list(reads.values()) + list(writes.values()):
        times.sort()
    ends, name_of = {}, {}
    for line in open(f'{d}/ss.txt'):
        parts = line.split()
        if len(parts) < 6 or parts[0] != 'ESTAB':
            continue
        for name, pid, fd in re.findall(r'\("([^"]+)",pid=(\d+),fd=(\d+)\)', line):
            ends[(parts[3], parts[4])] = (int(pid), int(fd))
            name_of[int(pid)] = name

    def role(pid):
        name = name_of.get(pid, '')
        return 'upstream' if 'ticking' in name else 'client' if 'proxy-comp' in name else 'proxy'

    to_upstream, to_client = {}, {}
    for (local, peer), key in ends.items():
        other = ends.get((peer, local))
        if role(key[0]) != 'proxy' or other is None:
            continue
        if role(other[0]) == 'upstream':
            to_upstream[key] = other
        elif role(other[0]) == 'client':
            to_client[key] = other

    leg1, leg2, leg3 = [], [], []
    for proxy_end, upstream_end in to_upstream.items():
        sent = writes.get(upstream_end, [])
        for t in reads.get(proxy_end, []):
            i = bisect.bisect_right(sent, t)
            if i > 0 and t - sent[i - 1] < LONGEST:
                leg1.append(t - sent[i - 1])
    clients = [k for k in to_client if writes.get(k)]

    def next_after(times, t):
        i = bisect.bisect_right(times, t)
        return times[i] - t if i < len(times) else None

    for proxy_end in to_upstream:
        read_at = reads.get(proxy_end, [])
        if len(read_at) < 5:
            continue
        best, best_median = None, None
        for c in clients:
            gaps = sorted(g for g in (next_after(writes[c], t) for t in read_at) if g is not None)
            if len(gaps) < 0.8 * len(read_at):
                continue
            if best_median is None or gaps[len(gaps) // 2] < best_median:
                best, best_median = c, gaps[len(gaps) // 2]
        if best is not None:
            leg2.extend(g for g in (next_after(writes[best], t) for t in read_at) if g is not None)
    for proxy_end, client_end in to_client.items():
        for t in writes.get(proxy_end, []):
            gap = next_after(reads.get(client_end, []), t)
            if gap is not None and gap < LONGEST:
                leg3.append(gap)

    print(f'connections: proxy-upstream {len(to_upstream)}, proxy-client {len(to_client)}')
    for name, xs in (('1. upstream write -> proxy read', leg1),
                     ('2. proxy read -> proxy write', leg2),
                     ('3. proxy write -> client read', leg3)):
        xs.sort()
        if not xs:
            print(f'{name}: none')
            continue
        p = lambda q: xs[min(len(xs) - 1, int(len(xs) * q))] * 1e3
        print(f'{name}: n {len(xs)}, p50 {p(.5):.3f} ms, p90 {p(.9):.3f}, p99 {p(.99):.3f}, p99.9 {p(.999):.3f}')


if __name__ == '__main__':
    main(sys.argv[1])

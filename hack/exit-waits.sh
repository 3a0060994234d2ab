#!/usr/bin/env bash
# Where the branch inits wait as they exit, off CPU, while a command runs:
# the kernel's scheduler events of processes named brinit (sched_switch
# with a stack, sched_wakeup, sched_process_exit) through tracefs, then,
# per distinct kernel stack of a sleep after the exit began, how many,
# their sum and median. This kernel's tracefs has neither function_graph
# nor kprobes; this found the overlay's end in the init's exit
# (docs/benchmarks.md, "Where the branch init makes its mount namespace").
#   hack/exit-waits.sh OUT COMMAND...
# for example, from integration/ with a test binary built:
#   hack/exit-waits.sh /tmp/t.txt env BENCH_TAIL_OPS=30 BRANCHBOX_BIN=$PWD/../bin \
#     /tmp/bench.test -test.run '^$' -test.bench BenchmarkTail -test.benchtime 1x
set -eu
out=$1
shift
T=/sys/kernel/tracing
[ -d $T/events ] || mount -t tracefs nodev $T
events="sched/sched_process_exit sched/sched_switch sched/sched_wakeup"
stop() {
	echo 0 >$T/tracing_on
	echo '!stacktrace' >$T/events/sched/sched_switch/trigger 2>/dev/null || true
	for e in $events; do echo 0 >$T/events/$e/enable; echo 0 >$T/events/$e/filter; done
}
trap stop EXIT
echo 0 >$T/tracing_on
echo >$T/trace
echo 16384 >$T/buffer_size_kb
echo 'comm == "brinit"' >$T/events/sched/sched_process_exit/filter
echo 'comm == "brinit"' >$T/events/sched/sched_wakeup/filter
echo 'prev_comm == "brinit"' >$T/events/sched/sched_switch/filter
echo 'stacktrace if prev_comm == "brinit"' >$T/events/sched/sched_switch/trigger
for e in $events; do echo 1 >$T/events/$e/enable; done
echo 1 >$T/tracing_on
"$@" || true
echo 0 >$T/tracing_on
cat $T/trace >"$out"
python3 - "$out" <<'PY'
import collections, re, statistics, sys
lines = open(sys.argv[1]).read().split('\n')
skip = {'trace_event_raw_event_sched_switch', '__traceiter_sched_switch', '__schedule',
        'schedule', 'schedule_timeout', 'io_schedule'}
exited, asleep, waits = set(), {}, collections.defaultdict(list)
i = 0
while i < len(lines):
    m = re.search(r'\s(\d+\.\d+): (\w+): (.*)', lines[i])
    i += 1
    if not m:
        continue
    t, kind, rest = float(m.group(1)) * 1e3, m.group(2), m.group(3)
    if kind == 'sched_process_exit':
        exited.add(int(re.search(r' pid=(\d+)', rest).group(1)))
    elif kind == 'sched_switch':
        pid = int(re.search(r'prev_pid=(\d+)', rest).group(1))
        state = re.search(r'prev_state=(\S+)', rest).group(1)
        stack = []
        if i < len(lines) and '<stack trace>' in lines[i]:
            i += 1
            while i < len(lines) and lines[i].startswith(' =>'):
                stack.append(lines[i][4:])
                i += 1
        if pid in exited and state == 'D':
            asleep[pid] = (t, '<'.join([f for f in stack if f not in skip][:4]))
    elif kind == 'sched_wakeup':
        pid = int(re.search(r' pid=(\d+)', rest).group(1))
        if pid in asleep:
            t0, where = asleep.pop(pid)
            waits[where].append(t - t0)
print('%d inits exited' % len(exited))
for where, v in sorted(waits.items(), key=lambda x: -sum(x[1]))[:10]:
    print('%5d sleeps, %8.1f ms, median %.3f ms  %s' % (len(v), sum(v), statistics.median(v), where))
PY

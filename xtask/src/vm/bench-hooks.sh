#!/bin/sh
# What the syscall hooks' two backends cost on this kernel (`cargo xtask
# bench --vm`), run by /init in place of the tests. Interleaved, round by
# round: no stall, stall on trampolines, stall on the raw syscall
# tracepoints; for each, the traced job itself (4 KiB preads under `stall
# run`) and an untraced neighbour (4 KiB preads, and getppid: a syscall no
# hook is on) while stall traces another process, its agent stopped so that
# only the kernel side counts. One line per sample:
#   STALL-BENCH: <who> <workload> <backend> ops=N ns=T
# and STALL-BENCH-FAIL: <why> when a sample could not be taken.
# Usage: bench-hooks.sh ROUNDS OPS

rounds=$1 ops=$2
wl=/stall/bin/bench-wl
data=/tmp/bench-hooks.dat
out=/tmp/bench-hooks.out
dd if=/dev/zero of="$data" bs=1M count=16 2>/dev/null || { echo "STALL-BENCH-FAIL: cannot write $data"; exit 1; }

# sample WHO WORKLOAD BACKEND COMMAND...: runs COMMAND --out FILE, prints its line.
sample() {
    who=$1 what=$2 backend=$3
    shift 3
    rm -f "$out"
    if "$@" --out "$out" >/tmp/bench-hooks.log 2>&1 && [ -s "$out" ]; then
        echo "STALL-BENCH: $who $what $backend $(cat "$out")"
    else
        echo "STALL-BENCH-FAIL: $who $what $backend: $(tail -n 3 /tmp/bench-hooks.log | tr '\n' ' ')"
    fi
}

# The neighbour's two workloads, untraced, while stall (if any) traces a sleeper.
neighbour() {
    backend=$1
    sleep 600 &
    sleeper=$!
    tracer=""
    if [ "$backend" != none ]; then
        rm -f /tmp/bench-hooks.json
        "$STALL_BIN" attach --pid "$sleeper" -q --interval 0.5 --syscall-hooks "$backend" \
            --json /tmp/bench-hooks.json 2>/tmp/bench-hooks.stall &
        tracer=$!
        # Attached once its first interval record is out.
        i=0
        until [ -s /tmp/bench-hooks.json ] || [ $i -ge 600 ]; do
            sleep 0.2
            i=$((i + 1))
        done
        [ -s /tmp/bench-hooks.json ] || echo "STALL-BENCH-FAIL: stall attach ($backend) never attached: $(cat /tmp/bench-hooks.stall)"
    fi
    # The agent stopped meanwhile, its programs still attached: under TCG
    # both vCPUs share one host thread, so the agent's own CPU time would
    # slow the neighbour as much as any hook (the traced rows include it).
    [ -n "$tracer" ] && kill -STOP "$tracer"
    sample neighbour pread "$backend" "$wl" pread --file "$data" --ops "$ops"
    sample neighbour getppid "$backend" "$wl" getppid --ops "$ops"
    if [ -n "$tracer" ]; then
        kill -CONT "$tracer"
        kill -INT "$tracer"
        wait "$tracer"
    fi
    kill "$sleeper"
    wait "$sleeper" 2>/dev/null
}

for r in $(seq "$rounds"); do
    echo "STALL-BENCH-ROUND: $r of $rounds"
    for backend in none trampoline tracepoint; do
        if [ "$backend" = none ]; then
            sample traced pread none "$wl" pread --file "$data" --ops "$ops"
        else
            sample traced pread "$backend" "$STALL_BIN" run -q --syscall-hooks "$backend" -- \
                "$wl" pread --file "$data" --ops "$ops"
        fi
        neighbour "$backend"
    done
done

#!/bin/sh
# /init of stall's test VM (xtask/src/vm): mounts what stall and its tests
# need, runs each integration test binary in /stall/tests with our arguments
# (the kernel passes what follows `--` on its command line) — the hooks'
# tests on the trampoline backend where the kernel allows it, the rest and
# capture and hooks again on the tracepoint backend —, or only its shard's
# share of those runs (`stall.shard=K/N` on the kernel command line), prints
# ONE `STALL-VM-RESULT: PASS|FAIL ...` line and powers off. qemu exits 0
# whatever happened, so that line is the only verdict xtask trusts.

export PATH=/usr/bin:/usr/sbin:/bin:/sbin HOME=/root
set -o pipefail

finish() {
    echo "STALL-VM-RESULT: $*"
    # Let the serial port drain before the power goes.
    sleep 1
    poweroff -f
    echo o >/proc/sysrq-trigger
}

mount -t proc proc /proc || finish "FAIL cannot mount /proc"
mount -t sysfs sysfs /sys || finish "FAIL cannot mount /sys"
mount -t devtmpfs devtmpfs /dev || finish "FAIL cannot mount /dev"
echo "STALL-VM-INIT: $(uname -r), $(nproc) CPUs, harness arguments: $*"
# The clocks behind the on-CPU numbers: the kernel's counter is on the
# scheduler clock, stall's timestamps on the clocksource (KERNELS.md).
echo "STALL-VM: clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource);" \
    "$(dmesg 2>/dev/null | grep -i -e 'sched_clock' -e 'tsc' | sed 's/^\[[^]]*\] //' | tr '\n' ';')"
mkdir -p /dev/shm /dev/pts
# stall reads formats from tracefs, pins nothing but aya may probe bpffs,
# the cgroup tests look for a cgroup2 mount in /proc/self/mountinfo,
# Python's multiprocessing needs /dev/shm for its semaphores, and the
# Ctrl-C test (signals.rs) a pseudo-terminal. /tmp stays on the root file
# system (already a tmpfs): the workspace may live under it.
for m in "tmpfs /dev/shm" "devpts /dev/pts" "tracefs /sys/kernel/tracing" "bpf /sys/fs/bpf" "cgroup2 /sys/fs/cgroup"; do
    fs=${m% *} dir=${m#* }
    mount -t "$fs" "$fs" "$dir" || finish "FAIL cannot mount $fs on $dir"
done
# The daemon test talks HTTP over loopback (there is no other network).
ip link set lo up || finish "FAIL cannot bring up lo"

chmod 1777 /tmp
. /stall/env.sh
# The GPU tests load a scripted NVML library in place of the driver's.
[ -f "$STALL_NVML_SCRIPT_LIB" ] || finish "FAIL no scripted NVML library at $STALL_NVML_SCRIPT_LIB"
# The CUDA tests' jobs load a stand-in CUDA library.
[ -f "$STALL_CUDA_STUB_LIB" ] || finish "FAIL no stand-in CUDA library at $STALL_CUDA_STUB_LIB"
# The NCCL tests' jobs load a stand-in NCCL library.
[ -f "$STALL_NCCL_STUB_LIB" ] || finish "FAIL no stand-in NCCL library at $STALL_NCCL_STUB_LIB"

# The scenario tests throttle their reads with the io cgroup controller,
# which needs a block device under /var/tmp: a RAM disk (brd), if xtask
# found the module of this kernel build.
module=$(ls /lib/modules/"$(uname -r)"/brd.ko* 2>/dev/null)
case $STALL_TEST_DIR in /var/tmp/*) module="" ;; esac # would hide the workspace
if [ -n "$module" ]; then
    case $module in *.xz) xzcat "$module" >/tmp/brd.ko && module=/tmp/brd.ko ;; esac
    insmod "$module" rd_nr=1 rd_size=$((768 * 1024)) && mke2fs /dev/ram0 >/dev/null && mkdir -p /var/tmp &&
        mount -t ext4 /dev/ram0 /var/tmp || finish "FAIL cannot put a RAM disk on /var/tmp"
else
    echo "STALL-VM: no RAM disk on /var/tmp (no brd module for $(uname -r), or the workspace is there)"
fi

cd "$STALL_TEST_DIR" || finish "FAIL no $STALL_TEST_DIR"

# `cargo xtask bench --vm`: the syscall hooks' cost instead of the tests.
if [ "$1" = "--bench-hooks" ]; then
    sh /stall/bench-hooks.sh "$2" "$3"
    finish "PASS bench done"
fi

passed=0 failed=0 failing=""
# run_test BINARY LABEL: one test binary with our arguments, tallied.
run_test() {
    t=$1 label=$2
    shift 2
    name=${t##*/}
    # Tests that cannot pass under emulation, one name a line (see vm.rs).
    skip=""
    if [ -f "/stall/skip/$name" ]; then
        while read -r s; do skip="$skip --skip $s"; done <"/stall/skip/$name"
    fi
    echo "STALL-VM: running $label$skip (STALL_SYSCALL_HOOKS=${STALL_SYSCALL_HOOKS:-auto})"
    start=$(cut -d' ' -f1 /proc/uptime)
    # $skip unquoted: split into --skip NAME pairs.
    "$t" "$@" $skip 2>&1 | tee /tmp/test.out
    rc=$?
    counts=$(awk '/^test result:/ { p += $4; f += $6 } END { print p + 0, f + 0 }' /tmp/test.out)
    passed=$((passed + ${counts% *})) failed=$((failed + ${counts#* }))
    [ "$rc" -eq 0 ] || failing="$failing $label"
    echo "STALL-VM: $label exited $rc after $(awk -v s="$start" '{ printf "%.1f", $1 - s }' /proc/uptime)s"
}

# The syscall hooks' two backends. Where the kernel allows trampolines they
# are forced (a silent fallback must not pass for them) for the tests of the
# hooks and of what attaches and detaches them: capture, daemon, faults,
# hooks, privilege; then every other test, and capture and hooks again, on
# the raw syscall tracepoints. Not everything on both: under TCG each stall
# start attaches 30 trampolines and each exit waits for RCU-tasks grace
# periods (3 s on 6.1), which doubles a binary's time. 5.10's BTF gives
# __x64_sys_copy_file_range no argument, so the verifier refuses that
# trampoline and `auto` falls back to the tracepoints: there every test runs
# once, as users get it.
on_trampolines=" capture daemon faults hooks privilege "
on_both=" capture hooks "
case $(uname -r) in
5.*) trampolines=no ;;
*) trampolines=yes; [ -e /sys/kernel/btf/vmlinux ] || trampolines=no ;;
esac
# The runs, `LABEL BINARY BACKEND` a line, in the order they run.
runs=/tmp/runs
: >"$runs"
if [ "$trampolines" = yes ]; then
    for name in $on_trampolines; do
        [ -x "/stall/tests/$name" ] && echo "$name[trampoline] /stall/tests/$name trampoline" >>"$runs"
    done
    for t in /stall/tests/*; do
        name=${t##*/}
        case "$on_trampolines" in *" $name "*) case "$on_both" in *" $name "*) ;; *) continue ;; esac ;; esac
        echo "$name[tracepoint] $t tracepoint" >>"$runs"
    done
else
    for t in /stall/tests/*; do
        echo "${t##*/} $t auto" >>"$runs"
    done
fi
# A shard runs its share, as shard.awk assigns it from the runs' weights
# (xtask/src/vm/shard.rs): each shard's boot computes the same split.
shard=$(sed -n 's/.*stall\.shard=\([0-9]*\/[0-9]*\).*/\1/p' /proc/cmdline)
if [ -n "$shard" ]; then
    awk -v shard="$shard" -f /stall/shard.awk /stall/weights "$runs" >/tmp/mine ||
        finish "FAIL cannot take shard $shard of the runs"
    echo "STALL-VM: shard $shard runs $(tr '\n' ' ' </tmp/mine)"
else
    cut -d' ' -f1 "$runs" >/tmp/mine
fi
# fd 3: the tests' stdin stays /dev/console, as before.
while read -r label t backend <&3; do
    grep -qxF "$label" /tmp/mine || continue
    export STALL_SYSCALL_HOOKS=$backend
    run_test "$t" "$label" "$@"
done 3<"$runs"

if [ -n "$failing" ]; then
    finish "FAIL $passed passed, $failed failed; failing:$failing"
elif [ "$passed" -eq 0 ] && [ -z "$shard" ]; then
    # A shard's filter may match nothing of its share: xtask judges the sum.
    finish "FAIL no test ran (does the filter match any?)"
else
    finish "PASS $passed passed"
fi

//! The runqueue-clock cache: a tracked switch's time from its runqueue's
//! clock, which the switch has just updated, in place of a helper call;
//! and a woken task's enqueue time on that clock (`queued_at`).
use stall_common::{Config, CpuSlot, SwitchReads};

use crate::now;

/// How long after this CPU read the clock and its runqueue's clock
/// together the runqueue's clock stands in for the clock (`switch_now`).
const CLOCK_SPAN_NS: u64 = 2_000_000;

/// The time of this switch, on `now()`'s clock. Where the runqueue is in
/// reach (`queued` variants; `current`: the current task as a BTF
/// pointer), its clock, which the switch has just updated, counts on from
/// this CPU's last reading of both clocks together (`CpuSlot::clock_rq`,
/// `clock_mono`) for up to `CLOCK_SPAN_NS`: a few loads in place of the
/// helper call, which cost a tracked switch 60 to 80 ns on the AMD host.
/// The two clocks drift apart by parts per million, nanoseconds over the
/// span; the runqueue's is the one the kernel's own `schedstat` totals
/// are taken on. Past the span, or with no runqueue, the clock is read
/// (and both are noted again).
#[inline(always)]
pub(super) fn switch_now<const HOW: u8>(
    cfg: &Config,
    current: *const u8,
    next: u64,
    slot: &mut Option<&'static mut CpuSlot>,
) -> u64 {
    if !SwitchReads::from_how(HOW).queued() || current.is_null() {
        return now();
    }
    let Some(s) = slot.as_mut() else {
        return now();
    };
    let clock = match runqueue(cfg, current, next) {
        // SAFETY: as in `runqueue`: a field of `struct rq` at the offset the
        // agent took from the kernel's BTF, a fault-safe load of a `u64`.
        Some((rq, _)) => unsafe {
            core::ptr::read_volatile(rq.add(cfg.task.rq_clock as usize) as *const u64)
        },
        None => 0,
    };
    // A runqueue clock behind the noted one wraps to a large `since`.
    let since = clock.wrapping_sub(s.clock_rq);
    if clock != 0 && s.clock_rq != 0 && since < CLOCK_SPAN_NS {
        return s.clock_mono + since;
    }
    let t = now();
    s.clock_rq = clock;
    s.clock_mono = t;
    t
}

/// This CPU's runqueue, reached from the current task (`se.cfs_rq->rq`,
/// `current` its BTF pointer), and its `curr`, if that is `next` already,
/// as the switch set it (else it is not the runqueue switching).
#[inline(always)]
fn runqueue(cfg: &Config, current: *const u8, next: u64) -> Option<(*const u8, *const u8)> {
    let o = &cfg.task;
    // SAFETY: `current` is the current task as a BTF pointer. Each load is
    // at an offset the agent took from the kernel's BTF for a field of the
    // loaded type (pointers to `struct cfs_rq`, `struct rq` and `struct
    // task_struct`), through a pointer the verifier typed from the one
    // before: it checks each against that BTF (refusing the program
    // otherwise, and the agent loads another) and makes it a fault-safe
    // load, a fault reading 0.
    unsafe {
        let cfs_rq = core::ptr::read_volatile(current.add(o.se_cfs_rq as usize) as *const *const u8);
        let rq = core::ptr::read_volatile(cfs_rq.add(o.cfs_rq_rq as usize) as *const *const u8);
        let curr = core::ptr::read_volatile(rq.add(o.rq_curr as usize) as *const *const u8);
        (curr as u64 == next).then_some((rq, curr))
    }
}

/// When `next`, switching in at `ts` after an off-CPU span from `since`,
/// was put on the runqueue, on the clock of `ts`; 0 where unknown. Its wait
/// for a CPU is what the kernel adds to its `run_delay` right after this
/// tracepoint: the runqueue's clock, as the switch updated it, less the
/// task's `sched_info.last_queued`. That clock differs from `ts`'s, so only
/// the difference crosses over. The runqueue is the current task's
/// (`se.cfs_rq->rq`); its `curr` is `next` already, and leads to its field.
/// `current`: the current task as a BTF pointer (`bpf_get_current_task_btf`
/// or `bpf_rdonly_cast`).
#[inline(always)]
pub(super) fn queued_at(cfg: &Config, current: *const u8, next: u64, ts: u64, since: u64) -> u64 {
    let o = &cfg.task;
    let Some((rq, curr)) = runqueue(cfg, current, next) else {
        return 0;
    };
    // SAFETY: as in `runqueue`: fields of `struct rq` and of `next` (its
    // `curr`, typed by the verifier) at offsets from the kernel's BTF,
    // fault-safe loads of `u64`s.
    let (clock, queued) = unsafe {
        (
            core::ptr::read_volatile(rq.add(o.rq_clock as usize) as *const u64),
            core::ptr::read_volatile(curr.add(o.last_queued as usize) as *const u64),
        )
    };
    let waited = clock.wrapping_sub(queued);
    // Not queued since it went off-CPU, or clocks that disagree.
    if queued == 0 || queued > clock || waited > ts.saturating_sub(since) {
        return 0;
    }
    ts - waited
}

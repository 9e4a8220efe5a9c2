//! Tasks known not to be ours, so that the scheduler hooks pass over the
//! rest of the machine without a hash lookup or a read of the task: a
//! switch or a wakeup of such a task costs a few inlined array reads. A
//! task is noted by its address (what the tracepoints hand over, no field
//! read) when it goes off-CPU untracked and, in cgroup mode, outside every
//! watched cgroup. The note holds the generations it was taken under, and
//! holds no longer once anything could have made the task ours:
//! - the agent changed what is tracked (`TRACK_GEN`, which it bumps after
//!   writing `THREADS` or `CGROUPS`);
//! - a task moved between cgroups (`MIGRATIONS`, counted in cgroup mode);
//! - a task was created at that address (task structs are reused), or a
//!   program inserted it into `THREADS`: both [`forget`] it.
use crate::{
    atomic_add,
    maps::{UntrackedNote, MIGRATIONS, UNTRACKED, UNTRACKED_SLOTS},
};

/// The generations a note is valid under (`gen`: `TRACK_GEN`).
#[inline(always)]
pub(crate) fn generations(gen: u32) -> u64 {
    let migrations = MIGRATIONS.get(0).copied().unwrap_or(0);
    u64::from(gen) | (migrations << 32)
}

/// The slot of a task address: task structs are slab objects of a few KiB,
/// so the low bits say little; a multiplicative hash spreads the rest.
#[inline(always)]
fn slot(task: u64) -> u32 {
    (task.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 50) as u32 & (UNTRACKED_SLOTS - 1)
}

/// Whether the task at `task` was noted under `gens`.
#[inline(always)]
pub(crate) fn known(task: u64, gens: u64) -> bool {
    UNTRACKED.get(slot(task)).is_some_and(|n| n.task == task && n.gens == gens)
}

/// Notes the task at `task` as not ours (a write only when the note changes).
#[inline(always)]
pub(crate) fn note(task: u64, gens: u64) {
    if let Some(p) = UNTRACKED.get_ptr_mut(slot(task)) {
        // SAFETY: `p` is the non-null pointer to an element of a
        // preallocated array map, aligned and valid for the program's run.
        // Another CPU may note a task of the same slot at once: a torn note
        // matches no task (both fields must match), and the task is looked
        // up at its next switch.
        unsafe {
            if (*p).task != task || (*p).gens != gens {
                (*p).task = task;
                (*p).gens = gens;
            }
        }
    }
}

/// Drops any note of the task at `task`: it is ours now, or a new task.
#[inline(always)]
pub(crate) fn forget(task: u64) {
    if let Some(p) = UNTRACKED.get_ptr_mut(slot(task)) {
        // SAFETY: as in `note`.
        unsafe {
            if (*p).task == task {
                (*p).task = 0;
            }
        }
    }
}

/// Cgroup mode: a task moved between cgroups, perhaps into a watched one.
#[inline(always)]
pub(crate) fn migrated() {
    if let Some(p) = MIGRATIONS.get_ptr_mut(0) {
        // SAFETY: the non-null pointer to the map's one aligned `u64`, valid
        // for the program's run; migrations on other CPUs add to it too.
        unsafe { atomic_add(p, 1) };
    }
}

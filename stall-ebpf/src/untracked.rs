//! Notes on tasks by their address, so that the scheduler hooks pass over
//! the rest of the machine without a hash lookup or a read of the task,
//! and find a tracked task's thread id without reading it: a switch or a
//! wakeup of a noted task costs a few inlined array reads. A task is noted
//! by its address (what the tracepoints hand over, no field read) when it
//! goes off-CPU: as not ours when it is untracked and, in cgroup mode,
//! outside every watched cgroup; as ours, with its thread id, when it is
//! tracked. The note holds the generations it was taken under, and holds
//! no longer once anything could have changed what the task is to us:
//! - the agent changed what is tracked (`TRACK_GEN`, which it bumps after
//!   writing `THREADS` or `CGROUPS`);
//! - a task moved between cgroups (`MIGRATIONS`, counted in cgroup mode);
//! - a task was created at that address (task structs are reused), or a
//!   program inserted it into `THREADS`: both [`forget`] it.
//!
//! A note of ours names the thread that has lived at the address since it
//! was created (a new task's note is forgotten first), so its thread id is
//! the task's own; whether that thread is still tracked is `THREADS`'s to
//! say.
use crate::{
    atomic_add,
    maps::{TaskNote, MIGRATIONS, UNTRACKED, UNTRACKED_SLOTS},
};

/// What is noted of a task.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Noted {
    /// Nothing (valid): look it up.
    Nothing,
    /// Not ours.
    NotOurs,
    /// Ours: its thread id.
    Ours(u32),
}

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

/// What was noted of the task at `task` under `gens`.
#[inline(always)]
pub(crate) fn noted(task: u64, gens: u64) -> Noted {
    match UNTRACKED.get(slot(task)) {
        Some(n) if n.task == task && n.gens == gens => {
            if n.tid == 0 {
                Noted::NotOurs
            } else {
                Noted::Ours(n.tid)
            }
        }
        _ => Noted::Nothing,
    }
}

/// Whether the task at `task` was noted as not ours under `gens`.
#[inline(always)]
pub(crate) fn known(task: u64, gens: u64) -> bool {
    noted(task, gens) == Noted::NotOurs
}

/// Notes the task at `task` as not ours (`tid` 0) or as our thread `tid`;
/// a write only when the note changes.
#[inline(always)]
fn write(task: u64, gens: u64, tid: u32) {
    if let Some(p) = UNTRACKED.get_ptr_mut(slot(task)) {
        // SAFETY: `p` is the non-null pointer to an element of a
        // preallocated array map, aligned and valid for the program's run.
        // Another CPU may note a task of the same slot at once: a torn note
        // may pair one task's address and generations with the other's
        // thread id. Both tasks are then going off-CPU on their CPUs, and
        // the next switch-out of either rewrites the note; a switch-in
        // meanwhile would take the wrong thread id, which the two-task race
        // makes rare, and which costs a miscount, never a fault.
        unsafe {
            if (*p).task != task || (*p).gens != gens || (*p).tid != tid {
                (*p).task = task;
                (*p).gens = gens;
                (*p).tid = tid;
            }
        }
    }
}

/// Notes the task at `task` as not ours.
#[inline(always)]
pub(crate) fn note(task: u64, gens: u64) {
    write(task, gens, 0);
}

/// Notes the task at `task` as our thread `tid`.
#[inline(always)]
pub(crate) fn note_ours(task: u64, gens: u64, tid: u32) {
    write(task, gens, tid);
}

/// Drops any note of the task at `task`: it is ours now, or a new task.
#[inline(always)]
pub(crate) fn forget(task: u64) {
    if let Some(p) = UNTRACKED.get_ptr_mut(slot(task)) {
        // SAFETY: as in `write`.
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

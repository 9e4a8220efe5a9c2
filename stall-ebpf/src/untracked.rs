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
//! was created (a new task's notes are forgotten first), so its thread id
//! is the task's own; whether that thread is still tracked, and is that
//! task, is `THREADS`'s to say (its entry holds the task's address). The
//! notes of ours are a table apart (`OURS`): two CPUs noting two tasks in
//! one slot at once can tear a note, and a torn one must never say "not
//! ours" of a tracked task, whose switches would then go unseen. Torn in
//! `UNTRACKED`, a note pairs untracked tasks' fields only; torn in `OURS`,
//! it names a thread whose entry holds another address, and is not taken.
use crate::{
    atomic_add,
    maps::{MIGRATIONS, OURS, OURS_SLOTS, UNTRACKED, UNTRACKED_SLOTS},
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

/// A multiplicative hash of a task address (task structs are slab objects
/// of a few KiB, so the low bits say little): its top bits.
#[inline(always)]
fn hash(task: u64) -> u32 {
    (task.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 50) as u32
}

/// What was noted of the task at `task` under `gens`.
#[inline(always)]
pub(crate) fn noted(task: u64, gens: u64) -> Noted {
    if known(task, gens) {
        return Noted::NotOurs;
    }
    match OURS.get(hash(task) & (OURS_SLOTS - 1)) {
        Some(n) if n.task == task && n.gens == gens && n.tid != 0 => Noted::Ours(n.tid),
        _ => Noted::Nothing,
    }
}

/// Whether the task at `task` was noted as not ours under `gens`.
#[inline(always)]
pub(crate) fn known(task: u64, gens: u64) -> bool {
    UNTRACKED.get(hash(task) & (UNTRACKED_SLOTS - 1)).is_some_and(|n| n.task == task && n.gens == gens)
}

/// Notes the task at `task` as not ours (a write only when the note changes).
#[inline(always)]
pub(crate) fn note(task: u64, gens: u64) {
    if let Some(p) = UNTRACKED.get_ptr_mut(hash(task) & (UNTRACKED_SLOTS - 1)) {
        // SAFETY: `p` is the non-null pointer to an element of a
        // preallocated array map, aligned and valid for the program's run.
        // Another CPU may note a task of the same slot at once: a torn note
        // pairs one untracked task's address with another's generations,
        // which matches no task or says of an untracked one what is true.
        unsafe {
            if (*p).task != task || (*p).gens != gens {
                (*p).task = task;
                (*p).gens = gens;
            }
        }
    }
}

/// Notes the task at `task` as our thread `tid` (a write only when the
/// note changes).
#[inline(always)]
pub(crate) fn note_ours(task: u64, gens: u64, tid: u32) {
    if let Some(p) = OURS.get_ptr_mut(hash(task) & (OURS_SLOTS - 1)) {
        // SAFETY: as in `note`. A note torn by another CPU noting another
        // of our tasks in this slot names a thread whose entry holds
        // another address: `sched::thread_of` does not take it.
        unsafe {
            if (*p).task != task || (*p).gens != gens || (*p).tid != tid {
                (*p).task = task;
                (*p).gens = gens;
                (*p).tid = tid;
            }
        }
    }
}

/// Drops any note of the task at `task`: it is ours now, or a new task.
#[inline(always)]
pub(crate) fn forget(task: u64) {
    if let Some(p) = UNTRACKED.get_ptr_mut(hash(task) & (UNTRACKED_SLOTS - 1)) {
        // SAFETY: as in `note`.
        unsafe {
            if (*p).task == task {
                (*p).task = 0;
            }
        }
    }
    if let Some(p) = OURS.get_ptr_mut(hash(task) & (OURS_SLOTS - 1)) {
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

//! Ring-buffer (`EVENTS`) records: what must be seen one by one (opens,
//! task creation, exec, exit, close, and timeline switches). Each starts
//! with an [`EventHeader`].

use crate::{FileStats, ThreadStats, COMM_LEN, PATH_LEN};

/// Ring-buffer event kinds ([`EventHeader::kind`]).
pub mod event_kind {
    pub const OPEN: u32 = 1;
    pub const NEWTASK: u32 = 2;
    pub const EXEC: u32 = 3;
    pub const EXIT: u32 = 4;
    pub const CLOSE: u32 = 5;
    /// A context switch of a tracked thread: only with `Config::timeline`.
    pub const SWITCH: u32 = 6;
    /// A tracked thread connected an inet socket: an [`super::OpenEvent`]
    /// whose `path` holds the peer's `sockaddr_in`/`sockaddr_in6` as the
    /// task passed it (`path_len` bytes).
    pub const CONNECT: u32 = 7;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventHeader {
    pub kind: u32,
    pub tid: u32,
    pub tgid: u32,
    pub job: u32,
    pub ts: u64,
}

/// A successful openat of a tracked thread.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OpenEvent {
    pub hdr: EventHeader,
    pub file_id: u64,
    pub fd: i32,
    pub dfd: i32,
    pub flags: u32,
    /// Length of `path` including the NUL, or a negative errno.
    pub path_len: i32,
    /// A dup of this descriptor (no path: the same open as that one); -1
    /// for an open.
    pub dup_of: i32,
    pub _pad: u32,
    pub path: [u8; PATH_LEN],
}

/// A tracked thread created a task (thread or process).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NewTaskEvent {
    pub hdr: EventHeader,
    pub child_tid: u32,
    pub child_tgid: u32,
    pub clone_flags: u64,
    pub comm: [u8; COMM_LEN],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecEvent {
    pub hdr: EventHeader,
    pub comm: [u8; COMM_LEN],
}

/// A tracked thread switched in (`on` 1) or out (`on` 0): the timeline's
/// raw material, sent only when it is asked for (`Config::timeline`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SwitchEvent {
    pub hdr: EventHeader,
    /// In: when the thread was woken during its off-CPU span (0: preempted,
    /// or not seen).
    pub wake_ts: u64,
    /// The kernel's on-CPU total of the thread (`sum_exec_runtime`) as of
    /// this switch; 0: not read.
    pub exec_ns: u64,
    /// Out: the syscall it is in (-1: none).
    pub nr: i32,
    /// Out: why it left the CPU (`reason`).
    pub reason: u8,
    pub on: u8,
    pub _pad: [u8; 2],
}

/// A tracked thread exited; its final counters (the map entry is gone).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitEvent {
    pub hdr: EventHeader,
    pub stats: ThreadStats,
    pub comm: [u8; COMM_LEN],
}

/// A tracked descriptor was closed; its final counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CloseEvent {
    pub hdr: EventHeader,
    pub fd: i32,
    pub _pad: u32,
    pub stats: FileStats,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    // Sizes are fixed so a change on one side cannot silently desync the other,
    // and every record is a multiple of 8 (ring-buffer reservations need it).
    #[test]
    fn layouts_have_no_hidden_padding() {
        assert_eq!(size_of::<EventHeader>(), 24);
        assert_eq!(size_of::<OpenEvent>(), 24 + 8 + 16 + 8 + PATH_LEN);
        assert_eq!(size_of::<SwitchEvent>(), 24 + 8 + 8 + 8);
        assert_eq!(size_of::<NewTaskEvent>(), 24 + 8 + 8 + 16);
        assert_eq!(size_of::<ExitEvent>(), 24 + size_of::<ThreadStats>() + 16);
        assert_eq!(size_of::<CloseEvent>(), 24 + 8 + 64);
        for s in [
            size_of::<OpenEvent>(),
            size_of::<ExitEvent>(),
            size_of::<CloseEvent>(),
            size_of::<SwitchEvent>(),
        ] {
            assert_eq!(s % 8, 0);
        }
    }
}

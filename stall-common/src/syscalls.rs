//! The syscalls family's shared tables: per syscall number, what the raw
//! syscall programs do (`hook`) and what a thread blocked in it waits for
//! (`syscall_class`), filled by the agent for its architecture and carried
//! in the load-time `Config`.

use crate::inflight;

/// Per syscall number, what the programs do with it: read-only data beside
/// the rest of the configuration, so that a lookup is one load from memory
/// the programs touch anyway (as a map, each syscall of the machine paid a
/// lookup's instructions twice, at its entry and its return).
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SyscallTables {
    /// What the raw syscall programs do (`hook`).
    pub hooks: [u8; syscall_class::TABLE_LEN as usize],
    /// What a thread blocked in it waits for (`syscall_class`).
    pub classes: [u8; syscall_class::TABLE_LEN as usize],
}

impl SyscallTables {
    /// The `hook` kind of syscall `nr` (`hook::NONE` out of the table).
    #[inline(always)]
    pub fn hook(&self, nr: i64) -> u8 {
        usize::try_from(nr).ok().and_then(|i| self.hooks.get(i)).copied().unwrap_or(hook::NONE)
    }

    /// The `syscall_class` of syscall `nr` (`OTHER` out of the table).
    #[inline(always)]
    pub fn class(&self, nr: i64) -> u8 {
        usize::try_from(nr).ok().and_then(|i| self.classes.get(i)).copied().unwrap_or(syscall_class::OTHER)
    }
}

impl Default for SyscallTables {
    fn default() -> Self {
        Self {
            hooks: [hook::NONE; syscall_class::TABLE_LEN as usize],
            classes: [syscall_class::OTHER; syscall_class::TABLE_LEN as usize],
        }
    }
}

impl core::fmt::Debug for SyscallTables {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let set = |t: &[u8]| t.iter().filter(|&&v| v != 0).count();
        f.debug_struct("SyscallTables")
            .field("hooked", &set(&self.hooks))
            .field("classified", &set(&self.classes))
            .finish()
    }
}

/// How a syscall number maps to a wait reason; the values of
/// `SyscallTables::classes`, filled by the agent for its architecture.
pub mod syscall_class {
    pub const OTHER: u8 = 0;
    pub const FUTEX: u8 = 1;
    /// read-family: refined to IO or POLL by the descriptor's kind.
    pub const READ: u8 = 2;
    pub const POLL: u8 = 3;
    pub const SLEEP: u8 = 4;
    /// write-family: refined to WRITE (a file) or SEND (a pipe or socket,
    /// waiting for its reader) by the descriptor's kind.
    pub const WRITE: u8 = 5;
    /// The sync family: always SYNC.
    pub const SYNC: u8 = 6;
    /// Sends a signal (kill, tgkill, pidfd_send_signal...): a thread it
    /// wakes was interrupted, not handed what it waited for. Blocked in
    /// it is OTHER, as any unclassed call.
    pub const SIGNAL: u8 = 7;
    /// exit_group: the threads of its own process it wakes are being
    /// killed with it (a wait for its exit in another process, a parent's
    /// `wait4`, ends as any other wait does). Blocked in it is OTHER.
    pub const EXIT_GROUP: u8 = 8;
    pub const TABLE_LEN: u32 = 1024;
}

/// What the raw syscall programs do for a syscall number; the values of
/// `SyscallTables::hooks`, filled by the agent for its architecture.
pub mod hook {
    pub const NONE: u8 = 0;
    /// read, pread64, readv, preadv, preadv2 (fd is argument 0 of each).
    pub const READ: u8 = 1;
    pub const OPENAT: u8 = 2;
    pub const CLOSE: u8 = 3;
    /// write, pwrite64, writev, pwritev, pwritev2 (fd is argument 0 of each).
    pub const WRITE: u8 = 4;
    /// open(path, flags): openat without the dirfd.
    pub const OPEN: u8 = 5;
    /// creat(path, mode): open(path, O_CREAT | O_WRONLY | O_TRUNC).
    pub const CREAT: u8 = 10;
    /// openat2(dfd, path, how, size): the flags are in `how`.
    pub const OPENAT2: u8 = 6;
    /// dup, dup2, dup3 (the old descriptor is argument 0).
    pub const DUP: u8 = 7;
    /// fcntl: a dup for `F_DUPFD` and `F_DUPFD_CLOEXEC`.
    pub const FCNTL: u8 = 8;
    /// sendfile(out_fd, in_fd, ...): a read of argument 1 and a write of
    /// argument 0.
    pub const SENDFILE: u8 = 9;
    /// splice(fd_in, off_in, fd_out, ...), copy_file_range(fd_in, off_in,
    /// fd_out, ...): a read of argument 0 and a write of argument 2.
    pub const COPY: u8 = 11;
    /// connect(fd, addr, len): an inet socket connected to the peer `addr`
    /// names (followed per descriptor from then on).
    pub const CONNECT: u8 = 12;

    /// The hooks whose exit completes what `inflight` kind `k` began.
    #[inline(always)]
    pub fn completes(hooked: u8, k: u32) -> bool {
        match k {
            super::inflight::READ => matches!(hooked, READ | SENDFILE | COPY),
            super::inflight::WRITE => hooked == WRITE,
            super::inflight::OPEN => matches!(hooked, OPENAT | OPEN | CREAT | OPENAT2),
            super::inflight::DUP => hooked == DUP || hooked == FCNTL,
            super::inflight::CONNECT => hooked == CONNECT,
            _ => false,
        }
    }
}

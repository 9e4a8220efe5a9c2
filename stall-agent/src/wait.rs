//! What a blocked thread waits on, and who is at the other end: the object
//! of the syscall it sleeps in (a pipe, a socket, a file, a lock), as /proc
//! shows it, with the processes that hold the pipe's other end or the lock.
//! Plain values and the parsers of what /proc says; the reading is the
//! host's (`job::Host::waits_on`).
use serde::Serialize;

use crate::detail::{Name, PathName, Peer, Text};

/// A process at the other end of a wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Party {
    pub pid: u32,
    pub comm: Name,
    /// What it did lately, where stall looked (a process outside the job
    /// the job waits on: the other end of a pipe or socket).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activity: Option<Activity>,
}

impl Party {
    pub fn new(pid: u32, comm: impl Into<Name>) -> Self {
        Self { pid, comm: comm.into(), activity: None }
    }
}

/// What a process did over a span of its recent past, from its own
/// counters in /proc: its CPU time and the bytes it read from storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Activity {
    pub span_ns: u64,
    /// CPU time of all its threads.
    pub cpu_ns: u64,
    /// Bytes it had read from storage (its reads' misses of the page
    /// cache), /proc/PID/io `read_bytes`.
    pub storage_read_bytes: u64,
}

impl Activity {
    pub fn secs(&self) -> f64 {
        self.span_ns as f64 / 1e9
    }

    /// CPUs it kept busy on average (1.0: one CPU all the time).
    pub fn cpu(&self) -> f64 {
        self.cpu_ns as f64 / self.span_ns.max(1) as f64
    }
}

impl std::fmt::Display for Party {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "pid {} ({})", self.pid, self.comm)
    }
}

/// The object of a blocked thread's syscall.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "object", rename_all = "snake_case")]
pub enum WaitObject {
    /// A pipe or FIFO (descriptor `fd`) the waiter writes into (`writing`)
    /// or reads from, and the processes other than the waiter's that hold
    /// its other end: the reader of what it writes, or the writers of what
    /// it reads.
    Pipe { fd: i32, writing: bool, others: Vec<Party> },
    /// A socket, its peer's address where it is a connected inet one, and
    /// the processes on this host holding its other end (a Unix socket's
    /// peer, a local TCP connection's other socket).
    Socket { fd: i32, peer: Option<Peer>, others: Vec<Party> },
    /// A regular file.
    File { fd: i32, path: PathName },
    /// A file lock (`flock`, `fcntl` F_SETLKW) on `path`, and who holds it
    /// now (the kernel's lock list).
    Lock { path: PathName, holders: Vec<Party> },
    /// A child process (`wait4`, `waitid`): the one waited for, or all of
    /// the waiter's children.
    Child { children: Vec<Party> },
}

impl WaitObject {
    /// "stdout, a pipe read by pid 812 (fluent-bit)", "the socket to
    /// 10.0.0.5:443", "flock on /tmp/build.lock, held by pid 4410 (python)".
    pub fn describe(&self) -> Text {
        Text::new(self.words())
    }

    fn words(&self) -> String {
        match self {
            WaitObject::Pipe { fd, writing, others } => {
                let name = fd_name(*fd).map(|n| format!("{n}, a pipe")).unwrap_or_else(|| "a pipe".into());
                let by = if *writing { "read by" } else { "written by" };
                match others.as_slice() {
                    [] => format!("{name} no other process holds"),
                    [one] => format!("{name} {by} {one}"),
                    [one, rest @ ..] => format!("{name} {by} {one} and {} more", rest.len()),
                }
            }
            WaitObject::Socket { fd, peer, others } => {
                let name = fd_name(*fd).map(|n| format!("{n}, ")).unwrap_or_default();
                let of = match others.as_slice() {
                    [] => String::new(),
                    [one] => format!(" of {one}"),
                    [one, rest @ ..] => format!(" of {one} and {} more", rest.len()),
                };
                match peer {
                    Some(p) => format!("{name}the socket to {p}{of}"),
                    None if others.is_empty() => format!("{name}a socket"),
                    None => format!("{name}a socket to {}", &of[4..]),
                }
            }
            WaitObject::File { path, .. } => path.to_string(),
            WaitObject::Lock { path, holders } => match holders.as_slice() {
                [] => format!("the lock on {path}"),
                [one] => format!("the lock on {path}, held by {one}"),
                [one, rest @ ..] => format!("the lock on {path}, held by {one} and {} more", rest.len()),
            },
            WaitObject::Child { children } => match children.as_slice() {
                [] => "a child process".into(),
                [one] => format!("child {one}"),
                [one, rest @ ..] => format!("child {one} and {} more", rest.len()),
            },
        }
    }

    /// The processes at its other end.
    pub fn parties(&self) -> &[Party] {
        match self {
            WaitObject::Pipe { others, .. } => others,
            WaitObject::Lock { holders, .. } => holders,
            WaitObject::Child { children } => children,
            WaitObject::Socket { others, .. } => others,
            WaitObject::File { .. } => &[],
        }
    }
}

fn fd_name(fd: i32) -> Option<&'static str> {
    match fd {
        0 => Some("stdin"),
        1 => Some("stdout"),
        2 => Some("stderr"),
        _ => None,
    }
}

/// What a syscall waits on, by its number: the descriptor in its first
/// argument, a lock, a child. None: no object to look up (futex, sleep).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    Descriptor,
    Lock,
    Child,
}

/// The syscalls whose wait has an object worth naming, by number.
pub fn subject_of(nr: i64) -> Option<Subject> {
    use stall_common::syscall_class as class;
    match crate::syscalls::class(nr) {
        // The read and write families (sockets' send and receive among
        // them) and the sync family: the descriptor is the first argument.
        class::READ | class::WRITE | class::SYNC => return Some(Subject::Descriptor),
        _ => {}
    }
    match crate::syscalls::name(nr).as_str() {
        "recvfrom" | "recvmsg" => Some(Subject::Descriptor),
        // fcntl blocks only in F_SETLKW and F_OFD_SETLKW.
        "flock" | "fcntl" => Some(Subject::Lock),
        "wait4" | "waitid" => Some(Subject::Child),
        _ => None,
    }
}

/// A lock of the kernel's list (/proc/locks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub pid: u32,
    /// Device (major, minor) and inode of the locked file.
    pub major: u32,
    pub minor: u32,
    pub ino: u64,
}

/// The locks held in the text of /proc/locks (waiters, the lines marked
/// `->`, are not holders). A line reads
/// `1: FLOCK  ADVISORY  WRITE 15680 fe:00:10010975 0 EOF`: the holder's
/// PID, the device's major:minor in hex and the inode. OFD locks have no
/// owning process (-1) and are left out.
pub fn parse_locks(text: &str) -> Vec<HeldLock> {
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(1) == Some(&"->") {
                return None;
            }
            let pid: u32 = f.get(4)?.parse().ok()?;
            let mut id = f.get(5)?.split(':');
            let major = u32::from_str_radix(id.next()?, 16).ok()?;
            let minor = u32::from_str_radix(id.next()?, 16).ok()?;
            let ino = id.next()?.parse().ok()?;
            Some(HeldLock { pid, major, minor, ino })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_locks_are_read_from_the_kernels_list() {
        let text = "1: FLOCK  ADVISORY  WRITE 15680 fe:00:10010975 0 EOF\n\
                    1: -> FLOCK  ADVISORY  WRITE 15702 fe:00:10010975 0 EOF\n\
                    2: POSIX  ADVISORY  WRITE 811 00:1a:4242 0 0\n\
                    3: OFDLCK ADVISORY  READ  -1 00:06:99 0 EOF\n";
        assert_eq!(
            parse_locks(text),
            [
                HeldLock { pid: 15680, major: 0xfe, minor: 0, ino: 10010975 },
                HeldLock { pid: 811, major: 0, minor: 0x1a, ino: 4242 },
            ]
        );
    }

    #[test]
    fn objects_say_what_they_are_and_who_holds_them() {
        let fb = Party::new(812, "fluent-bit");
        assert_eq!(
            WaitObject::Pipe { fd: 1, writing: true, others: vec![fb.clone()] }.describe(),
            "stdout, a pipe read by pid 812 (fluent-bit)"
        );
        assert_eq!(
            WaitObject::Socket { fd: 7, peer: Some("10.0.0.5:443".into()), others: vec![] }.describe(),
            "the socket to 10.0.0.5:443"
        );
        let server = Party::new(4242, "feature-srv");
        assert_eq!(
            WaitObject::Socket { fd: 7, peer: Some("127.0.0.1:8080".into()), others: vec![server.clone()] }
                .describe(),
            "the socket to 127.0.0.1:8080 of pid 4242 (feature-srv)"
        );
        assert_eq!(
            WaitObject::Socket { fd: 5, peer: None, others: vec![server] }.describe(),
            "a socket to pid 4242 (feature-srv)"
        );
        let lock = WaitObject::Lock { path: "/tmp/ext/lock".into(), holders: vec![fb] };
        assert_eq!(lock.describe(), "the lock on /tmp/ext/lock, held by pid 812 (fluent-bit)");
        assert_eq!(lock.parties()[0].pid, 812);
        assert_eq!(subject_of(73), Some(Subject::Lock));
        assert_eq!(subject_of(44), Some(Subject::Descriptor));
        assert_eq!(subject_of(202), None, "a futex has no object /proc names");
    }
}

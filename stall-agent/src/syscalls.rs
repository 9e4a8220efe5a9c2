//! The architecture's syscall numbers: which ones are which kind of wait (the
//! kernel side's `SyscallTables`), and names for the report.
use stall_common::{hook, syscall_class as class, SyscallTables};

/// (number, name, class) for x86-64. Only waits need a class; the names
/// cover what commonly blocks, so "other" can say what it was.
#[cfg(target_arch = "x86_64")]
const TABLE: &[(u32, &str, u8)] = &[
    (0, "read", class::READ),
    (17, "pread64", class::READ),
    (19, "readv", class::READ),
    (295, "preadv", class::READ),
    (327, "preadv2", class::READ),
    (202, "futex", class::FUTEX),
    (449, "futex_waitv", class::FUTEX),
    (7, "poll", class::POLL),
    (23, "select", class::POLL),
    (270, "pselect6", class::POLL),
    (271, "ppoll", class::POLL),
    (232, "epoll_wait", class::POLL),
    (281, "epoll_pwait", class::POLL),
    (441, "epoll_pwait2", class::POLL),
    (45, "recvfrom", class::POLL),
    (47, "recvmsg", class::POLL),
    (299, "recvmmsg", class::POLL),
    (43, "accept", class::POLL),
    (288, "accept4", class::POLL),
    (35, "nanosleep", class::SLEEP),
    (230, "clock_nanosleep", class::SLEEP),
    (34, "pause", class::SLEEP),
    (1, "write", class::WRITE),
    (2, "open", class::OTHER),
    (3, "close", class::OTHER),
    (9, "mmap", class::OTHER),
    (18, "pwrite64", class::WRITE),
    (20, "writev", class::WRITE),
    (296, "pwritev", class::WRITE),
    (328, "pwritev2", class::WRITE),
    (42, "connect", class::OTHER),
    (44, "sendto", class::WRITE),
    (46, "sendmsg", class::WRITE),
    (56, "clone", class::OTHER),
    (57, "fork", class::OTHER),
    (59, "execve", class::OTHER),
    (61, "wait4", class::OTHER),
    (62, "kill", class::SIGNAL),
    (200, "tkill", class::SIGNAL),
    (234, "tgkill", class::SIGNAL),
    (129, "rt_sigqueueinfo", class::SIGNAL),
    (297, "rt_tgsigqueueinfo", class::SIGNAL),
    (424, "pidfd_send_signal", class::SIGNAL),
    (231, "exit_group", class::EXIT_GROUP),
    (74, "fsync", class::SYNC),
    (75, "fdatasync", class::SYNC),
    (277, "sync_file_range", class::SYNC),
    (26, "msync", class::SYNC),
    (162, "sync", class::SYNC),
    (306, "syncfs", class::SYNC),
    (72, "fcntl", class::OTHER),
    (101, "ptrace", class::OTHER),
    (128, "rt_sigtimedwait", class::OTHER),
    (130, "rt_sigsuspend", class::OTHER),
    (16, "ioctl", class::OTHER),
    (24, "sched_yield", class::OTHER),
    (247, "waitid", class::OTHER),
    (257, "openat", class::OTHER),
    (437, "openat2", class::OTHER),
    (85, "creat", class::OTHER),
    (32, "dup", class::OTHER),
    (33, "dup2", class::OTHER),
    (292, "dup3", class::OTHER),
    (426, "io_uring_enter", class::OTHER),
    (435, "clone3", class::OTHER),
    (40, "sendfile", class::OTHER),
    (326, "copy_file_range", class::OTHER),
    (275, "splice", class::OTHER),
    (206, "io_setup", class::OTHER),
    (208, "io_getevents", class::OTHER),
    (332, "statx", class::OTHER),
    (262, "newfstatat", class::OTHER),
    (4, "stat", class::OTHER),
    (5, "fstat", class::OTHER),
    (217, "getdents64", class::OTHER),
    (11, "munmap", class::OTHER),
    (10, "mprotect", class::OTHER),
    (12, "brk", class::OTHER),
    (28, "madvise", class::OTHER),
];

#[cfg(not(target_arch = "x86_64"))]
compile_error!("stall's syscall table covers x86-64 only so far");

/// What the raw syscall programs do per syscall number (`SyscallTables::hooks`).
/// The read and write families are their wait classes; the rest are named.
pub fn hook_table() -> Vec<(u32, u8)> {
    TABLE
        .iter()
        .filter_map(|&(nr, name, c)| match (name, c) {
            (_, class::READ) => Some((nr, hook::READ)),
            (_, class::WRITE) => Some((nr, hook::WRITE)),
            ("openat", _) => Some((nr, hook::OPENAT)),
            ("open", _) => Some((nr, hook::OPEN)),
            ("creat", _) => Some((nr, hook::CREAT)),
            ("openat2", _) => Some((nr, hook::OPENAT2)),
            ("dup" | "dup2" | "dup3", _) => Some((nr, hook::DUP)),
            ("fcntl", _) => Some((nr, hook::FCNTL)),
            // A read of their source descriptor (a pipe's counts as IPC)
            // and a write of their destination.
            ("splice" | "copy_file_range", _) => Some((nr, hook::COPY)),
            ("sendfile", _) => Some((nr, hook::SENDFILE)),
            ("close", _) => Some((nr, hook::CLOSE)),
            // Socket reads and writes, counted per descriptor once connect
            // made it one stall follows.
            ("recvfrom" | "recvmsg", _) => Some((nr, hook::READ)),
            ("sendto" | "sendmsg", _) => Some((nr, hook::WRITE)),
            ("connect", _) => Some((nr, hook::CONNECT)),
            _ => None,
        })
        .collect()
}

/// The wait class per syscall number (`SyscallTables::classes`).
pub fn class_table() -> Vec<(u32, u8)> {
    TABLE.iter().filter(|(_, _, c)| *c != class::OTHER).map(|&(nr, _, c)| (nr, c)).collect()
}

/// Both tables as the programs read them, in their configuration.
pub fn tables() -> SyscallTables {
    let mut t = SyscallTables::default();
    for (nr, what) in hook_table() {
        t.hooks[nr as usize] = what;
    }
    for (nr, c) in class_table() {
        t.classes[nr as usize] = c;
    }
    t
}

/// The syscall's name: from the table, else from the architecture's full
/// list, else its number.
pub fn name(nr: i64) -> String {
    if nr < 0 {
        return "no syscall".into();
    }
    TABLE
        .iter()
        .find(|(n, _, _)| i64::from(*n) == nr)
        .map(|(_, name, _)| (*name).to_string())
        .or_else(|| Some(::syscalls::Sysno::new(usize::try_from(nr).ok()?)?.name().to_string()))
        .unwrap_or_else(|| format!("syscall {nr}"))
}

pub fn class(nr: i64) -> u8 {
    TABLE.iter().find(|(n, _, _)| i64::from(*n) == nr).map(|t| t.2).unwrap_or(class::OTHER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_unique_and_fit_the_table() {
        let mut seen = std::collections::HashSet::new();
        for (nr, name, _) in TABLE {
            assert!(seen.insert(nr), "{name} twice");
            assert!(*nr < class::TABLE_LEN);
        }
        assert_eq!(name(202), "futex");
        assert_eq!(name(9999), "syscall 9999");
        // Not in the table, named all the same.
        assert_eq!(name(73), "flock");
        assert_eq!(name(293), "pipe2");
        assert_eq!(class(7), class::POLL);
        assert_eq!(class(1), class::WRITE);
        let syncs: Vec<u32> = TABLE.iter().filter(|t| t.2 == class::SYNC).map(|t| t.0).collect();
        assert_eq!(syncs, [74, 75, 277, 26, 162, 306]);
    }

    #[test]
    fn the_programs_tables_hold_every_hook_and_class() {
        let t = tables();
        for (nr, what) in hook_table() {
            assert_eq!(t.hook(i64::from(nr)), what);
        }
        assert_eq!(t.hook(202), hook::NONE, "futex is not hooked");
        assert_eq!(t.class(202), class::FUTEX);
        assert_eq!(t.class(0), class::READ);
        for nr in [-1, i64::from(class::TABLE_LEN), i64::MAX] {
            assert_eq!((t.hook(nr), t.class(nr)), (hook::NONE, class::OTHER), "{nr}");
        }
    }

    #[test]
    fn hooks_cover_every_way_to_name_read_and_write_a_file() {
        let hooks = hook_table();
        let named = |n: &str| TABLE.iter().find(|t| t.1 == n).map(|t| t.0).unwrap();
        for f in ["read", "pread64", "readv", "preadv", "preadv2"] {
            assert!(hooks.contains(&(named(f), hook::READ)), "{f}");
        }
        for f in ["write", "pwrite64", "writev", "pwritev", "pwritev2"] {
            assert!(hooks.contains(&(named(f), hook::WRITE)), "{f}");
        }
        // x86-64 numbers, as the kernel's syscall_64.tbl has them.
        let writes: Vec<u32> = hooks.iter().filter(|h| h.1 == hook::WRITE).map(|h| h.0).collect();
        assert_eq!(writes, [1, 18, 20, 296, 328, 44, 46]);
        assert!(hooks.contains(&(named("openat"), hook::OPENAT)));
        assert!(hooks.contains(&(named("close"), hook::CLOSE)));
        // The other ways to name a file, and reads that are not read().
        let by_nr = |h: u8| {
            let mut v: Vec<u32> = hooks.iter().filter(|x| x.1 == h).map(|x| x.0).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(by_nr(hook::OPEN), [2]);
        assert_eq!(by_nr(hook::CREAT), [85]);
        assert_eq!(by_nr(hook::OPENAT2), [437]);
        assert_eq!(by_nr(hook::DUP), [32, 33, 292]);
        assert_eq!(by_nr(hook::FCNTL), [72]);
        assert_eq!(by_nr(hook::READ), [0, 17, 19, 45, 47, 295, 327]);
        assert_eq!(by_nr(hook::CONNECT), [42]);
        assert_eq!(by_nr(hook::COPY), [275, 326]);
        assert_eq!(by_nr(hook::SENDFILE), [40]);
        assert_eq!(hooks.len(), 27);
    }
}

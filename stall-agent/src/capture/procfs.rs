//! What /proc says about the target at attach time: its process tree, its
//! threads and their current waits, and its open files.
use std::{
    collections::HashMap,
    fs,
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
};

use crate::decode::Inode;

/// The host's name (the UTS namespace's), or `localhost`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub fn exists(pid: u32) -> bool {
    PathBuf::from(format!("/proc/{pid}")).exists()
}

/// Thread ids of a process.
pub fn threads(pid: u32) -> Vec<u32> {
    read_ids(&format!("/proc/{pid}/task"))
}

fn read_ids(dir: &str) -> Vec<u32> {
    let Ok(rd) = fs::read_dir(dir) else { return Vec::new() };
    let mut ids: Vec<u32> = rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    ids.sort_unstable();
    ids
}

/// The fields of /proc/PID/stat we use. `comm` may hold spaces and parens,
/// so the line is split at the last ')'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    pub comm: String,
    pub state: char,
    pub ppid: u32,
    /// Start time in clock ticks since boot.
    pub start_ticks: u64,
    /// CPU time of all its threads (utime + stime), clock ticks.
    pub cpu_ticks: u64,
}

pub fn parse_stat(text: &str) -> Option<Stat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text[open + 1..close].to_string();
    let rest: Vec<&str> = text[close + 1..].split_whitespace().collect();
    Some(Stat {
        comm,
        state: rest.first()?.chars().next()?,
        ppid: rest.get(1)?.parse().ok()?,
        start_ticks: rest.get(19)?.parse().ok()?,
        cpu_ticks: rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?,
    })
}

/// Clock ticks (as /proc counts times) in ns.
pub fn ticks_to_ns(ticks: u64) -> u64 {
    // SAFETY: sysconf reads a constant of the C library.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    ticks.saturating_mul(1_000_000_000 / per_s.max(1) as u64)
}

pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

pub fn thread_stat(pid: u32, tid: u32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?)
}

/// The syscall a blocked thread is in (/proc/PID/task/TID/syscall): its
/// number (-1 when blocked outside one) and first argument; None when it
/// runs or cannot be read.
pub fn thread_syscall(pid: u32, tid: u32) -> Option<Syscall> {
    parse_syscall(&thread_syscall_text(pid, tid).ok()?)
}

/// /proc/PID/task/TID/syscall as is; an error where it cannot be read (a
/// ptrace check that even root can fail, e.g. for another PID namespace's
/// init), which callers tell apart from "running".
pub fn thread_syscall_text(pid: u32, tid: u32) -> std::io::Result<String> {
    fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syscall {
    pub nr: i64,
    pub arg0: Option<u64>,
}

pub fn parse_syscall(text: &str) -> Option<Syscall> {
    let mut f = text.split_whitespace();
    let nr = f.next()?.parse().ok()?;
    let arg0 = f.next().and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
    Some(Syscall { nr, arg0 })
}

/// The kernel's own scheduling totals for a thread
/// (/proc/PID/task/TID/schedstat, CONFIG_SCHED_INFO): on-CPU and
/// runqueue-wait time, ns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedstat {
    pub exec_ns: u64,
    pub delay_ns: u64,
}

pub fn parse_schedstat(text: &str) -> Option<Schedstat> {
    let mut f = text.split_whitespace().map(|v| v.parse::<u64>().ok());
    Some(Schedstat { exec_ns: f.next()??, delay_ns: f.next()?? })
}

pub fn thread_schedstat(pid: u32, tid: u32) -> Option<Schedstat> {
    parse_schedstat(&fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?)
}

pub fn thread_comm(pid: u32, tid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?;
    Some(text.trim_end_matches('\n').to_string())
}

/// `rchar` + `wchar` of /proc/PID/io: bytes through every read- and
/// write-family syscall of the process so far.
pub fn io_chars(pid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok());
    Some(field("rchar:")? + field("wchar:")?)
}

/// The process's environment as it was at exec (NUL-separated). Callers
/// keep only what they name: environments hold secrets.
pub fn environ(pid: u32) -> Option<Vec<u8>> {
    fs::read(format!("/proc/{pid}/environ")).ok()
}

pub fn cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let parts: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    (!parts.is_empty()).then(|| parts.join(" "))
}

/// A process's children (/proc/PID/task/TID/children of each thread).
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut out: Vec<u32> = threads(pid)
        .into_iter()
        .filter_map(|tid| fs::read_to_string(format!("/proc/{pid}/task/{tid}/children")).ok())
        .flat_map(|text| text.split_whitespace().filter_map(|c| c.parse().ok()).collect::<Vec<u32>>())
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Parent → children for every process on the machine.
pub fn children_map() -> HashMap<u32, Vec<u32>> {
    let mut map: HashMap<u32, Vec<u32>> = HashMap::new();
    for pid in read_ids("/proc") {
        if let Some(st) = stat(pid) {
            map.entry(st.ppid).or_default().push(pid);
        }
    }
    map
}

/// A descriptor open in a process.
#[derive(Debug, Clone)]
pub struct OpenFd {
    pub fd: i32,
    pub target: String,
    pub regular: bool,
}

pub fn open_fds(pid: u32) -> Vec<OpenFd> {
    let dir = format!("/proc/{pid}/fd");
    let Ok(rd) = fs::read_dir(&dir) else { return Vec::new() };
    let mut fds: Vec<OpenFd> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            fd_info(pid, fd).map(|o| OpenFd { fd, target: o.target, regular: o.regular })
        })
        .collect();
    fds.sort_by_key(|f| f.fd);
    fds
}

/// Where a descriptor points and whether it is a regular file (the link
/// is followed: `metadata` of /proc/PID/fd/N is the open file's).
pub fn fd_info(pid: u32, fd: i32) -> Option<Opened> {
    let link = PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
    let target = fs::read_link(&link).ok()?.to_string_lossy().into_owned();
    Some(Opened::from_meta(target, &fs::metadata(&link).ok()?))
}

/// What the descriptor `fd` that `pid` opened as `path` points to, where it
/// is still that open: by the time the open is looked at, the number may
/// have been closed and given to another open (a temporary file created,
/// mapped and unlinked, its number then taken by a dataset shard), and
/// taking the second for the first names one file by the other's path.
/// The same file: a relative path from the working directory leads to the
/// descriptor's inode, or (given relative to another directory, or gone
/// since) the descriptor's target has the path's file name; else a
/// relative path is what it names from the working directory now, and an
/// absolute one (gone since: `stat` failed) is not known. An open without
/// a path (a copy of an unknown descriptor) is taken as it is.
pub fn fd_info_of_open(pid: u32, fd: i32, path: &str) -> Option<Opened> {
    let link = format!("/proc/{pid}/fd/{fd}");
    let now = fs::read_link(&link).ok().and_then(|t| identified(&link, t.to_string_lossy().into_owned()));
    if path.is_empty() {
        return now.map(|(opened, _)| opened);
    }
    let from_cwd = if path.starts_with('/') { None } else { cwd_info(pid, path) };
    if let (Some((opened, id)), Some((_, cwd_id))) = (&now, &from_cwd) {
        if id == cwd_id {
            return Some(opened.clone());
        }
    }
    let name =
        |p: &str| Path::new(p.strip_suffix(" (deleted)").unwrap_or(p)).file_name().map(|n| n.to_os_string());
    match now {
        Some((opened, _)) if name(path).is_some() && name(&opened.target) == name(path) => Some(opened),
        // Another open's now: the path from the working directory, as
        // open took it (unless given relative to another directory).
        _ => from_cwd.map(|(opened, _)| opened),
    }
}

/// What `path` leads to (links followed), as `target`, with its device and
/// inode: one `stat`.
fn identified(path: &str, target: String) -> Option<(Opened, (u64, u64))> {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path).ok()?;
    let id = (meta.dev(), meta.ino());
    Some((Opened::from_meta(target, &meta), id))
}

/// What a relative path names from `pid`'s working directory now, and its
/// device and inode.
fn cwd_info(pid: u32, path: &str) -> Option<(Opened, (u64, u64))> {
    let cwd = fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
    let target = cwd.join(path.trim_start_matches("./")).to_string_lossy().into_owned();
    identified(&format!("/proc/{pid}/cwd/{path}"), target)
}

/// The inode of the listening TCP socket that accepts connections to
/// `peer` ("addr:port", "[v6]:port") in `pid`'s network namespace
/// (/proc/PID/net/tcp and tcp6), if one does.
pub fn listener_of(pid: u32, peer: &str) -> Option<u64> {
    let (ip, port) = split_peer(peer)?;
    ["tcp", "tcp6"].iter().find_map(|t| {
        let text = fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok()?;
        parse_listener(&text, ip, port)
    })
}

/// The inodes of the TCP sockets at the address `peer` in `pid`'s network
/// namespace: listening there (or on the wildcard address at its port),
/// or connected from there.
pub fn sockets_at(pid: u32, peer: &str) -> Vec<u64> {
    let Some((ip, port)) = split_peer(peer) else { return Vec::new() };
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .flat_map(|text| parse_sockets_at(&text, ip, port))
        .collect()
}

fn split_peer(peer: &str) -> Option<(std::net::IpAddr, u16)> {
    let (addr, port) = peer.rsplit_once(':')?;
    Some((addr.trim_start_matches('[').trim_end_matches(']').parse().ok()?, port.parse().ok()?))
}

/// In the text of /proc/net/tcp{,6}: the inodes of the sockets whose local
/// address is `ip` (or, listening, the wildcard) at `port`.
pub fn parse_sockets_at(text: &str, ip: std::net::IpAddr, port: u16) -> Vec<u64> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
            let (hex_addr, hex_port) = local.split_once(':')?;
            if u16::from_str_radix(hex_port, 16).ok()? != port {
                return None;
            }
            let bound = super::sockets::kernel_ip(hex_addr)?;
            let same = bound == ip || bound.to_canonical() == ip.to_canonical();
            let inode: u64 = inode.parse().ok()?;
            (same || (*state == "0A" && bound.is_unspecified())).then_some(inode).filter(|i| *i != 0)
        })
        .collect()
}

/// In the text of /proc/net/tcp{,6}: the inode of a socket listening
/// (state 0A) on `port` at `ip` or at the wildcard address.
pub fn parse_listener(text: &str, ip: std::net::IpAddr, port: u16) -> Option<u64> {
    text.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (local, state, inode) = (f.get(1)?, f.get(3)?, f.get(9)?);
        if *state != "0A" {
            return None;
        }
        let (hex_addr, hex_port) = local.split_once(':')?;
        if u16::from_str_radix(hex_port, 16).ok()? != port {
            return None;
        }
        let bound = super::sockets::kernel_ip(hex_addr)?;
        let wildcard = bound.is_unspecified();
        let same = bound == ip || bound.to_canonical() == ip.to_canonical();
        (wildcard || same).then(|| inode.parse().ok()).flatten()
    })
}

/// The peers of the connected TCP sockets in `pid`'s network namespace, by
/// socket inode ("address:port", "[v6]:port"): what a socket open before
/// stall came is connected to.
pub fn socket_peers(pid: u32) -> HashMap<u64, String> {
    ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .flat_map(|text| parse_socket_peers(&text))
        .collect()
}

/// In the text of /proc/net/tcp{,6}: (inode, peer) of every socket with a
/// peer (not listening), its address as [`super::sockets::parse_tcp`]
/// reads it.
pub fn parse_socket_peers(text: &str) -> Vec<(u64, String)> {
    super::sockets::parse_tcp(text)
        .into_iter()
        .filter(|s| !s.remote.0.is_unspecified())
        .map(|s| {
            let peer = match s.remote.0 {
                std::net::IpAddr::V4(v4) => format!("{v4}:{}", s.remote.1),
                std::net::IpAddr::V6(v6) => format!("[{v6}]:{}", s.remote.1),
            };
            (s.inode, peer)
        })
        .collect()
}

/// Whether `pid` holds the socket with inode `inode`.
pub fn holds_socket(pid: u32, inode: u64) -> bool {
    let want = format!("socket:[{inode}]");
    let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) else { return false };
    rd.filter_map(Result::ok).any(|e| fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == want.as_str()))
}

/// The path `pid` maps the file `inode` from (/proc/PID/maps), if it maps it.
pub fn mapped_path(pid: u32, inode: Inode) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
    parse_mapped_path(&text, inode)
}

/// The path of the first mapping of `inode` in the text of a maps file:
/// "start-end perms offset MAJOR:MINOR INODE PATH", numbers in hex but the
/// inode's.
pub fn parse_mapped_path(maps: &str, inode: Inode) -> Option<String> {
    maps.lines().find_map(|line| {
        let mut f = line.split_whitespace();
        let (_, _, _, dev, ino) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
        let path = f.collect::<Vec<_>>().join(" ");
        let (major, minor) = dev.split_once(':')?;
        let (major, minor) = (u32::from_str_radix(major, 16).ok()?, u32::from_str_radix(minor, 16).ok()?);
        let found = Inode { dev: (major << 20) | (minor & 0xf_ffff), ino: ino.parse().ok()? };
        (found == inode && path.starts_with('/')).then_some(path)
    })
}

/// What an absolute path names now (following links, as open does).
pub fn path_info(path: &str) -> Option<Opened> {
    Some(Opened::from_meta(path.to_string(), &fs::metadata(path).ok()?))
}

/// What an opened descriptor is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    /// Where it points (as /proc/PID/fd/FD reads).
    pub target: String,
    /// A regular file (not a pipe, socket or device).
    pub regular: bool,
    /// Its device and inode, for what the page cache says of it.
    pub inode: Option<Inode>,
}

impl Opened {
    fn from_meta(target: String, meta: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        let ft = meta.file_type();
        let regular = ft.is_file() && !ft.is_fifo() && !ft.is_socket();
        let inode = regular.then(|| Inode::from_stat(meta.dev(), meta.ino()));
        Self { target, regular, inode }
    }
}

/// A regular file a process holds open for writing (a log, a checkpoint,
/// stdout redirected to a file), as it stands at attach: a job whose log
/// has not grown for minutes is a hang candidate before any write is seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenFile {
    pub fd: i32,
    /// Where the descriptor points (as /proc/PID/fd/FD reads; a deleted
    /// file ends in " (deleted)").
    pub path: String,
    /// Last modification, ns since the Unix epoch (CLOCK_REALTIME).
    pub mtime_ns_realtime: u64,
    pub size: u64,
    /// fd 1 or 2 (stdout, stderr).
    pub stdio: bool,
}

/// Every regular file `pid` has open for writing (access mode not
/// O_RDONLY, from /proc/PID/fdinfo/FD), plus fds 1 and 2 whenever they are
/// regular files, by fd. Size and mtime are stat'ed through /proc/PID/fd/FD,
/// which reaches the open file itself, whatever mount namespace it is in.
pub fn written_files(pid: u32) -> Vec<WrittenFile> {
    use std::os::unix::fs::MetadataExt;
    let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let mut out: Vec<WrittenFile> = rd
        .filter_map(|e| {
            let e = e.ok()?;
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let link = e.path();
            let meta = fs::metadata(&link).ok()?;
            if !meta.file_type().is_file() {
                return None;
            }
            let stdio = fd == 1 || fd == 2;
            if !stdio {
                let info = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
                if fdinfo_flags(&info)? & libc::O_ACCMODE as u32 == libc::O_RDONLY as u32 {
                    return None;
                }
            }
            let mtime_ns = (meta.mtime() as i128) * 1_000_000_000 + i128::from(meta.mtime_nsec());
            Some(WrittenFile {
                fd,
                path: fs::read_link(&link).ok()?.to_string_lossy().into_owned(),
                mtime_ns_realtime: u64::try_from(mtime_ns).unwrap_or(0),
                size: meta.len(),
                stdio,
            })
        })
        .collect();
    out.sort_by_key(|f| f.fd);
    out
}

/// The `flags:` line of a /proc/PID/fdinfo/FD file (octal).
pub fn fdinfo_flags(text: &str) -> Option<u32> {
    let v = text.lines().find_map(|l| l.strip_prefix("flags:"))?;
    u32::from_str_radix(v.trim(), 8).ok()
}

pub fn cwd(pid: u32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/cwd")).ok()
}

/// The agent's own CPU time, seconds (utime + stime).
pub fn self_cpu_seconds() -> f64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    let Some(rest) = text.rfind(')').map(|i| &text[i + 2..]) else { return 0.0 };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime, stime are fields 14 and 15 (11 and 12 after the comm).
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    ticks as f64 / hz
}

/// The agent's own resident memory, bytes.
pub fn self_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_syscall_a_thread_waits_in() {
        let futex = "202 0x7f3a2c000b60 0x80 0x0 0x0 0x0 0x0 0x7ffd5b2e8a40 0x7f3a2e4d1a3d\n";
        assert_eq!(parse_syscall(futex), Some(Syscall { nr: 202, arg0: Some(0x7f3a_2c00_0b60) }));
        // Blocked outside a syscall (a page fault): the number only.
        assert_eq!(parse_syscall("-1 0x7ffd5b2e8a40 0x7f3a2e4d1a3d\n").map(|s| s.nr), Some(-1));
        assert_eq!(parse_syscall("running\n"), None);
    }

    /// A descriptor whose number another open took before it was looked
    /// at is not taken for the first open: its target must have the path's
    /// file name (or, relative to the working directory, be its inode).
    #[test]
    fn a_reused_descriptor_number_is_not_taken_for_the_open_it_was() {
        use std::os::fd::AsRawFd;
        let dir = std::env::temp_dir().join(format!("stall-reused-fd-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let shard = dir.join("data-00004-of-00007.arrow");
        fs::write(&shard, b"rows").unwrap();
        let file = fs::File::open(&shard).unwrap();
        let (pid, fd) = (std::process::id(), file.as_raw_fd());
        // The open it is: by the same name, absolute or relative to any
        // directory (openat), and one without a path.
        for path in [shard.to_str().unwrap(), "ds/data-00004-of-00007.arrow", ""] {
            let opened = fd_info_of_open(pid, fd, path).unwrap_or_else(|| panic!("{path}"));
            assert_eq!(opened.target, shard.to_str().unwrap());
            assert!(opened.inode.is_some());
        }
        // A semaphore's temporary file, unlinked, whose number the shard took.
        assert_eq!(fd_info_of_open(pid, fd, "/dev/shm/sem.J0ldhE"), None);
        assert_eq!(fd_info_of_open(pid, fd, "ds/data-00003-of-00007.arrow"), None);
        // A relative path whose number another open took: what it names
        // from the working directory.
        let cwd = std::env::current_dir().unwrap();
        let here =
            cwd.read_dir().unwrap().filter_map(Result::ok).find(|e| e.path().is_file()).expect("a file here");
        let name = here.file_name().into_string().unwrap();
        let opened = fd_info_of_open(pid, fd, &name).unwrap();
        assert_eq!(opened.target, cwd.join(&name).to_str().unwrap());
        assert_ne!(opened.inode, fd_info(pid, fd).unwrap().inode);
        drop(file);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn listeners_by_address_and_port() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: 0100007F:4961 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5551 1 0\n\
             1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5552 1 0\n\
             2: 0100007F:A2B4 0100007F:4961 01 00000000:00000000 00:00000000 00000000     0        0 5553 1 0\n";
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(parse_listener(tcp, lo, 18785), Some(5551));
        // The wildcard address accepts on every address.
        assert_eq!(parse_listener(tcp, "10.0.0.5".parse().unwrap(), 8080), Some(5552));
        // A connected socket is no listener.
        assert_eq!(parse_listener(tcp, lo, 41652), None);
        assert_eq!(parse_listener(tcp, "10.0.0.5".parse().unwrap(), 18785), None);
        let tcp6 = "  sl  local_address remote st\n\
             0: 00000000000000000000000001000000:01BB 00000000000000000000000000000000:0000 0A 0:0 0:0 0 0 0 7771 1\n";
        assert_eq!(parse_listener(tcp6, "::1".parse().unwrap(), 443), Some(7771));
    }

    #[test]
    fn sockets_at_an_address_listening_or_connected_from_it() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: 0100007F:4961 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5551 1 0\n\
             1: 0100007F:4961 0100007F:A2B4 01 00000000:00000000 00:00000000 00000000     0        0 5552 1 0\n\
             2: 0100007F:A2B4 0100007F:4961 01 00000000:00000000 00:00000000 00000000     0        0 5553 1 0\n\
             3: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5554 1 0\n";
        let lo: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        // A server's port: its listener and the connection it accepted.
        assert_eq!(parse_sockets_at(tcp, lo, 18785), [5551, 5552]);
        // A client's ephemeral port: its end of the connection only.
        assert_eq!(parse_sockets_at(tcp, lo, 41652), [5553]);
        // Listening on every address.
        assert_eq!(parse_sockets_at(tcp, "10.0.0.5".parse().unwrap(), 8080), [5554]);
        assert!(parse_sockets_at(tcp, "10.0.0.5".parse().unwrap(), 18785).is_empty());
        assert_eq!(split_peer("[::1]:443"), Some(("::1".parse().unwrap(), 443)));
    }

    #[test]
    fn peers_of_connected_sockets() {
        let tcp = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: 0100007F:4961 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5551 1 0\n\
             1: 0100007F:A2B4 0100007F:4961 01 00000000:00000000 00:00000000 00000000     0        0 5553 1 0\n";
        assert_eq!(parse_socket_peers(tcp), vec![(5553, "127.0.0.1:18785".to_string())]);
        let tcp6 = "  sl  local remote st\n\
             0: 00000000000000000000000001000000:A2B4 0000000000000000FFFF00000500000A:01BB 01 0:0 0:0 0 0 0 7772 1\n\
             1: 00000000000000000000000001000000:A2B5 B80D0120000000000000000001000000:01BB 01 0:0 0:0 0 0 0 7773 1\n";
        assert_eq!(
            parse_socket_peers(tcp6),
            vec![(7772, "10.0.0.5:443".to_string()), (7773, "[2001:db8::1]:443".to_string())]
        );
    }

    #[test]
    fn mapped_paths_by_device_and_inode() {
        let maps = "55d0a000-55d0b000 r--p 00000000 fd:01 1311 /usr/bin/python3.11\n\
                    7f00-7f80 r--s 00000000 08:11 4242 /data/cache/train/data-00000-of-00002.arrow\n\
                    7f80-7f90 rw-p 00000000 00:00 0 \n\
                    7f90-7fa0 r--s 00000000 08:11 4243 /data/my shard (1).arrow\n";
        let inode = |major: u32, minor: u32, ino| Inode { dev: (major << 20) | minor, ino };
        assert_eq!(
            parse_mapped_path(maps, inode(8, 0x11, 4242)).as_deref(),
            Some("/data/cache/train/data-00000-of-00002.arrow")
        );
        assert_eq!(
            parse_mapped_path(maps, inode(8, 0x11, 4243)).as_deref(),
            Some("/data/my shard (1).arrow")
        );
        assert_eq!(parse_mapped_path(maps, inode(0xfd, 1, 1311)).as_deref(), Some("/usr/bin/python3.11"));
        assert_eq!(parse_mapped_path(maps, inode(8, 0x12, 4242)), None);
        assert_eq!(parse_mapped_path(maps, inode(0, 0, 0)), None);
    }

    #[test]
    fn schedstat_fields() {
        assert_eq!(parse_schedstat("62105 59913 2\n"), Some(Schedstat { exec_ns: 62105, delay_ns: 59913 }));
        assert_eq!(parse_schedstat("x 1 2"), None);
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn stat_with_odd_comm() {
        let line = "4242 (pt_data (w) 1) S 4000 4242 4000 0 -1 4194560 0 0 0 0 1 2 0 0 20 0 3 0 987654 0 0";
        let st = parse_stat(line).unwrap();
        assert_eq!(st.comm, "pt_data (w) 1");
        assert_eq!(st.state, 'S');
        assert_eq!(st.ppid, 4000);
        assert_eq!(st.start_ticks, 987654);
    }

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        assert!(exists(me));
        assert!(threads(me).contains(&me));
        let st = stat(me).unwrap();
        assert!(st.ppid > 0);
        assert!(open_fds(me).iter().any(|f| f.fd <= 2));
    }

    #[test]
    fn fdinfo_flags_are_octal() {
        let text = "pos:\t0\nflags:\t0100001\nmnt_id:\t25\nino:\t42\n";
        assert_eq!(fdinfo_flags(text), Some(0o100001));
        assert_eq!(fdinfo_flags("pos:\t0\n"), None);
    }

    #[test]
    fn written_files_of_own_process() {
        use std::{
            io::Write,
            os::{fd::AsRawFd, unix::fs::MetadataExt},
        };
        let dir = std::env::temp_dir().join(format!("stall-written-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (w, rw, ro) = (dir.join("log.txt"), dir.join("ckpt.bin"), dir.join("data.bin"));
        let mut log = fs::File::create(&w).unwrap();
        log.write_all(&[b'x'; 12_345]).unwrap();
        log.flush().unwrap();
        let ckpt =
            fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&rw).unwrap();
        ckpt.set_len(777).unwrap();
        fs::write(&ro, b"only read").unwrap();
        let data = fs::File::open(&ro).unwrap();

        let listed = written_files(std::process::id());
        let find = |fd: i32| listed.iter().find(|f| f.fd == fd);
        let l = find(log.as_raw_fd()).unwrap_or_else(|| panic!("log missing: {listed:?}"));
        let meta = fs::metadata(&w).unwrap();
        assert_eq!(l.path, w.to_str().unwrap());
        assert_eq!(l.size, 12_345);
        assert_eq!(l.mtime_ns_realtime, meta.mtime() as u64 * 1_000_000_000 + meta.mtime_nsec() as u64);
        assert!(!l.stdio);
        let c = find(ckpt.as_raw_fd()).unwrap_or_else(|| panic!("O_RDWR file missing: {listed:?}"));
        assert_eq!((c.path.as_str(), c.size), (rw.to_str().unwrap(), 777));
        assert!(find(data.as_raw_fd()).is_none(), "a read-only file is listed: {listed:?}");
        assert!(listed.iter().all(|f| f.stdio == (f.fd == 1 || f.fd == 2)));
        drop((log, ckpt, data));
        let _ = fs::remove_dir_all(&dir);
    }
}

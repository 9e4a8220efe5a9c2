//! What a blocked thread waits on, read from /proc: the descriptor or
//! lock in its syscall's arguments (/proc/PID/task/TID/syscall), what the
//! descriptor is (/proc/PID/fd), and who holds the other end — a pipe's
//! other holders (every process's descriptors), a socket's peer on this
//! host (`sockets`), a lock's holder (/proc/locks), the children waited
//! for.
use std::{
    collections::HashMap,
    fs,
    os::unix::fs::{FileTypeExt, MetadataExt},
    time::{Duration, Instant},
};

use super::{procfs, sockets};
use crate::wait::{parse_locks, subject_of, Party, Subject, WaitObject};

/// Who holds a pipe's or a socket's other end, remembered a while:
/// finding out reads every process's descriptors, which a node with
/// thousands of processes makes slow; a pipe's reader or a connection's
/// server seldom changes.
#[derive(Default)]
pub struct PipeHolders {
    /// By what a descriptor links to (`pipe:[ino]`, a FIFO's path, the
    /// waiter's `socket:[ino]`): when looked up, and who holds it (reading
    /// or not).
    seen: HashMap<String, (Instant, Vec<(Party, bool)>)>,
}

const PIPE_HOLDERS_FOR: Duration = Duration::from_secs(10);

impl PipeHolders {
    fn holders(&mut self, key: &str, find: impl FnOnce() -> Vec<(Party, bool)>) -> &[(Party, bool)] {
        let now = Instant::now();
        self.seen.retain(|_, (at, _)| now.duration_since(*at) < PIPE_HOLDERS_FOR);
        &self.seen.entry(key.to_string()).or_insert_with(|| (now, find())).1
    }

    /// The processes other than `tgid` holding the pipe at the end that
    /// reads (`reading`) or at the end that writes; `target` is what a
    /// descriptor of it links to (`pipe:[ino]`, or a FIFO's path).
    fn others(&mut self, target: &str, tgid: u32, reading: bool) -> Vec<Party> {
        let all = self.holders(target, || holders_of(target));
        let mut out: Vec<Party> =
            all.iter().filter(|(p, r)| p.pid != tgid && *r == reading).map(|(p, _)| p.clone()).collect();
        out.dedup();
        out
    }

    /// The processes other than `tgid` holding the other end of its socket
    /// `ino` (descriptor `fd`, `target`: `socket:[ino]`), where it is on
    /// this host.
    fn socket_others(&mut self, target: &str, tgid: u32, fd: i32, ino: u64) -> Vec<Party> {
        let all = self.holders(&format!("{tgid}/{target}"), || match sockets::other_end(tgid, ino) {
            Some(end) => holders_of(&format!("socket:[{end}]")),
            None => sockets::peer_pid(tgid, fd).and_then(party).map(|p| (p, true)).into_iter().collect(),
        });
        let mut out: Vec<Party> = all.iter().filter(|(p, _)| p.pid != tgid).map(|(p, _)| p.clone()).collect();
        out.dedup();
        out
    }
}

/// What thread `tid` of `tgid` waits on, if it is blocked in syscall `nr`
/// (as the kernel side last saw it) and that call has an object.
pub fn wait_object(tgid: u32, tid: u32, nr: i64, pipes: &mut PipeHolders) -> Option<WaitObject> {
    let subject = subject_of(nr)?;
    let call = procfs::thread_syscall(tgid, tid)?;
    // Woken meanwhile, or in another call: its arguments are not this wait's.
    if call.nr != nr {
        return None;
    }
    let arg0 = call.arg0?;
    match subject {
        Subject::Descriptor => {
            let writing = crate::syscalls::class(nr) == stall_common::syscall_class::WRITE;
            descriptor(tgid, arg0 as i32, writing, pipes)
        }
        Subject::Lock => {
            let link = format!("/proc/{tgid}/fd/{}", arg0 as i32);
            let path = fs::read_link(&link).ok()?.to_string_lossy().into_owned();
            let meta = fs::metadata(&link).ok()?;
            let (major, minor) = (libc::major(meta.dev()), libc::minor(meta.dev()));
            let text = fs::read_to_string("/proc/locks").ok()?;
            let mut holders: Vec<Party> = parse_locks(&text)
                .into_iter()
                .filter(|l| l.ino == meta.ino() && l.major == major && l.minor == minor && l.pid != tgid)
                .filter_map(|l| party(l.pid))
                .collect();
            holders.dedup();
            Some(WaitObject::Lock { path: path.into(), holders })
        }
        Subject::Child => {
            // wait4(pid): pid > 0 is that child; otherwise any of them.
            let want = (nr == 61).then_some(arg0 as i32).filter(|p| *p > 0);
            let children = procfs::children_of(tgid)
                .into_iter()
                .filter(|c| want.is_none_or(|w| *c == w as u32))
                .filter_map(party)
                .collect();
            Some(WaitObject::Child { children })
        }
    }
}

/// What descriptor `fd` of `tgid` is: a pipe (and who holds its other
/// end, read from where `writing` is false), a socket, or a file.
pub fn descriptor(tgid: u32, fd: i32, writing: bool, pipes: &mut PipeHolders) -> Option<WaitObject> {
    let link = format!("/proc/{tgid}/fd/{fd}");
    let target = fs::read_link(&link).ok()?.to_string_lossy().into_owned();
    let meta = fs::metadata(&link).ok()?;
    let ft = meta.file_type();
    if ft.is_fifo() {
        return Some(WaitObject::Pipe { fd, writing, others: pipes.others(&target, tgid, writing) });
    }
    if ft.is_socket() {
        let peer = procfs::socket_peers(tgid).remove(&meta.ino());
        let others = pipes.socket_others(&target, tgid, fd, meta.ino());
        return Some(WaitObject::Socket { fd, peer: peer.map(Into::into), others });
    }
    Some(WaitObject::File { fd, path: target.into() })
}

/// Every process holding a descriptor to `target` ("pipe:[123]", a FIFO's
/// path), and
/// whether that descriptor reads (its access mode, /proc/PID/fdinfo).
fn holders_of(target: &str) -> Vec<(Party, bool)> {
    let Ok(rd) = fs::read_dir("/proc") else { return Vec::new() };
    let mut out: Vec<(Party, bool)> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .flat_map(|pid| {
            let modes: Vec<bool> = fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t.as_os_str() == target))
                .filter_map(|e| {
                    let info =
                        fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", e.file_name().to_str()?)).ok()?;
                    let mode = procfs::fdinfo_flags(&info)? & libc::O_ACCMODE as u32;
                    Some(mode != libc::O_WRONLY as u32)
                })
                .collect();
            let party = if modes.is_empty() { None } else { party(pid) };
            party.into_iter().flat_map(move |p| modes.clone().into_iter().map(move |m| (p.clone(), m)))
        })
        .collect();
    out.sort_by_key(|(p, reading)| (p.pid, *reading));
    out.dedup();
    out
}

fn party(pid: u32) -> Option<Party> {
    Some(Party::new(pid, procfs::stat(pid)?.comm))
}

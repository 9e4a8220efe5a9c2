//! Kernel records → plain values: ring-buffer events and map snapshots in
//! the form the (pure) aggregation consumes. Nothing here touches the kernel.
//!
//! The ring-buffer events are decoded here; the counters and the map
//! snapshots are modules of their own, re-exported.
use stall_common::{
    event_kind, CloseEvent, EventHeader, ExecEvent, ExitEvent, NewTaskEvent, OpenEvent, SwitchEvent, COMM_LEN,
};

mod counters;
mod snapshot;

pub(crate) use counters::counters;
pub use counters::{fold, last_other_nr, Counter, FileCounters, GpuCounters, ThreadCounters, ThreadNow};
pub use snapshot::{CommSnap, FdWaitSnap, FileSnap, Inode, InodeSnap, Snapshot, ThreadSnap, WakeSnap};

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    Open {
        ts: u64,
        tid: u32,
        tgid: u32,
        fd: i32,
        file_id: u64,
        path: String,
        dfd: i32,
        /// A dup of this descriptor (`path` is empty: the same open).
        dup_of: Option<i32>,
    },
    /// An inet socket connected: followed per descriptor like a file, its
    /// traffic named by the peer ("10.0.0.5:443", "[::1]:8000").
    Connect {
        ts: u64,
        tgid: u32,
        fd: i32,
        file_id: u64,
        peer: String,
    },
    NewTask {
        ts: u64,
        parent_tid: u32,
        parent_tgid: u32,
        child_tid: u32,
        child_tgid: u32,
        comm: String,
    },
    Exec {
        ts: u64,
        tid: u32,
        tgid: u32,
        comm: String,
    },
    Exit {
        ts: u64,
        tid: u32,
        tgid: u32,
        comm: String,
        /// Boxed: the largest variant by far, and one event per thread.
        counters: Box<ThreadCounters>,
        other_nr: i32,
    },
    Close {
        ts: u64,
        tgid: u32,
        fd: i32,
        file_id: u64,
        counters: FileCounters,
    },
    /// Only with `--timeline`: not part of the model.
    Switch(Switch),
}

/// One context switch of a traced thread, from the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Switch {
    pub ts: u64,
    pub tid: u32,
    pub tgid: u32,
    /// Switched in (else out).
    pub on: bool,
    /// Out: why it left the CPU (`stall_common::reason`), and the syscall
    /// it is in (-1: none).
    pub reason: u8,
    pub nr: i32,
    /// In: when it was woken (0: it was preempted, or not seen).
    pub wake_ts: u64,
    /// The kernel's on-CPU total of the thread as of the switch (0: none).
    pub exec_ns: u64,
}

/// An event and the job (attach target, daemon cgroup) it belongs to.
pub type JobEvent = (u32, Event);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("ring-buffer record of {0} bytes is too short")]
    Short(usize),
    #[error("unknown ring-buffer record kind {0}")]
    Kind(u32),
}

fn read<T: Copy>(buf: &[u8]) -> Result<T, DecodeError> {
    if buf.len() < size_of::<T>() {
        return Err(DecodeError::Short(buf.len()));
    }
    // SAFETY: length checked; T is a repr(C) plain-data type from stall-common.
    Ok(unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<T>()) })
}

/// The name of waker 0: a wakeup made in interrupt context (a device, a
/// timer, the network), which the kernel side gives to no task.
pub const KERNEL_WAKER: &str = "[interrupt]";

pub fn comm(raw: &[u8; COMM_LEN]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(COMM_LEN);
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

pub fn decode(buf: &[u8]) -> Result<JobEvent, DecodeError> {
    let hdr: EventHeader = read(buf)?;
    let event = match hdr.kind {
        event_kind::OPEN => {
            let e: OpenEvent = read(buf)?;
            let n = usize::try_from(e.path_len).unwrap_or(0).min(e.path.len());
            let end = e.path[..n].iter().position(|b| *b == 0).unwrap_or(n);
            Event::Open {
                ts: hdr.ts,
                tid: hdr.tid,
                tgid: hdr.tgid,
                fd: e.fd,
                file_id: e.file_id,
                path: String::from_utf8_lossy(&e.path[..end]).into_owned(),
                dfd: e.dfd,
                dup_of: (e.dup_of >= 0).then_some(e.dup_of),
            }
        }
        event_kind::CONNECT => {
            let e: OpenEvent = read(buf)?;
            let n = usize::try_from(e.path_len).unwrap_or(0).min(e.path.len());
            Event::Connect {
                ts: hdr.ts,
                tgid: hdr.tgid,
                fd: e.fd,
                file_id: e.file_id,
                peer: peer_of(&e.path[..n]).unwrap_or_else(|| "unknown peer".into()),
            }
        }
        event_kind::NEWTASK => {
            let e: NewTaskEvent = read(buf)?;
            Event::NewTask {
                ts: hdr.ts,
                parent_tid: hdr.tid,
                parent_tgid: hdr.tgid,
                child_tid: e.child_tid,
                child_tgid: e.child_tgid,
                comm: comm(&e.comm),
            }
        }
        event_kind::EXEC => {
            let e: ExecEvent = read(buf)?;
            Event::Exec { ts: hdr.ts, tid: hdr.tid, tgid: hdr.tgid, comm: comm(&e.comm) }
        }
        event_kind::EXIT => {
            let e: ExitEvent = read(buf)?;
            Event::Exit {
                ts: hdr.ts,
                tid: hdr.tid,
                tgid: hdr.tgid,
                comm: comm(&e.comm),
                counters: Box::new(fold(&e.stats, hdr.ts).0),
                other_nr: e.stats.other_nr,
            }
        }
        event_kind::CLOSE => {
            let e: CloseEvent = read(buf)?;
            Event::Close {
                ts: hdr.ts,
                tgid: hdr.tgid,
                fd: e.fd,
                file_id: e.stats.file_id,
                counters: FileCounters::from(&e.stats),
            }
        }
        event_kind::SWITCH => {
            let e: SwitchEvent = read(buf)?;
            Event::Switch(Switch {
                ts: hdr.ts,
                tid: hdr.tid,
                tgid: hdr.tgid,
                on: e.on != 0,
                reason: e.reason,
                nr: e.nr,
                wake_ts: e.wake_ts,
                exec_ns: e.exec_ns,
            })
        }
        k => return Err(DecodeError::Kind(k)),
    };
    Ok((hdr.job, event))
}

/// "address:port" of a `sockaddr_in` or `sockaddr_in6` as the task passed
/// it to connect (family in host order, port and address in network order).
pub fn peer_of(sockaddr: &[u8]) -> Option<String> {
    let family = u16::from_ne_bytes(sockaddr.get(..2)?.try_into().ok()?);
    let port = u16::from_be_bytes(sockaddr.get(2..4)?.try_into().ok()?);
    match family {
        2 => {
            let a: [u8; 4] = sockaddr.get(4..8)?.try_into().ok()?;
            Some(format!("{}:{port}", std::net::Ipv4Addr::from(a)))
        }
        10 => {
            let a: [u8; 16] = sockaddr.get(8..24)?.try_into().ok()?;
            let ip = std::net::Ipv6Addr::from(a);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => format!("{v4}:{port}"),
                None => format!("[{ip}]:{port}"),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;

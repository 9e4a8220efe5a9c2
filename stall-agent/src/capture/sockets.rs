//! The other end of a process's socket on this host: a Unix socket's peer,
//! as the kernel's socket diagnostics tell it (NETLINK_SOCK_DIAG, what
//! `ss -x` asks), and the other socket of a TCP connection between two
//! processes of the host (/proc/PID/net/tcp{,6}). Who holds that socket is
//! the caller's question (`waits_on`). Where the kernel has no Unix socket
//! diagnostics (`unix_diag` a module nobody loaded), the peer's credentials
//! name its process instead ([`peer_pid`]).
use std::{
    fs,
    mem::MaybeUninit,
    net::IpAddr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::Duration,
};

use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_REQUEST};
use netlink_packet_sock_diag::{
    unix::{ShowFlags, StateFlags, UnixRequest},
    SockDiagMessage,
};
use socket2::{Domain, Protocol, Socket, Type};

/// The inode of the socket at the other end of `pid`'s socket `inode`:
/// its Unix peer, or the local end of its TCP connection where both ends
/// are on this host. None: unconnected, remote, or not to be found.
pub fn other_end(pid: u32, inode: u64) -> Option<u64> {
    tcp_other_end(pid, inode).or_else(|| unix_peer(pid, inode))
}

/// One TCP socket of /proc/net/tcp{,6}: its local and remote address, and
/// its inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpEnds {
    pub local: (IpAddr, u16),
    pub remote: (IpAddr, u16),
    pub inode: u64,
}

fn tcp_other_end(pid: u32, inode: u64) -> Option<u64> {
    let all: Vec<TcpEnds> = ["tcp", "tcp6"]
        .iter()
        .filter_map(|t| fs::read_to_string(format!("/proc/{pid}/net/{t}")).ok())
        .flat_map(|text| parse_tcp(&text))
        .collect();
    other_of(&all, inode)
}

/// The socket of `all` whose ends are `inode`'s, swapped.
pub fn other_of(all: &[TcpEnds], inode: u64) -> Option<u64> {
    let mine = all.iter().find(|s| s.inode == inode)?;
    all.iter().find(|s| s.inode != 0 && s.local == mine.remote && s.remote == mine.local).map(|s| s.inode)
}

/// An address as /proc/net/tcp prints it: the kernel's 32-bit words in
/// host (little-endian) order, hex.
pub fn kernel_ip(hex: &str) -> Option<IpAddr> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).ok())
        .collect::<Option<_>>()?;
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// The sockets in the text of /proc/net/tcp{,6} that have a peer, with
/// their addresses made canonical (an IPv4-mapped IPv6 address as IPv4:
/// a dual-stack listener's accepted end shows its client that way).
pub fn parse_tcp(text: &str) -> Vec<TcpEnds> {
    let end = |s: &str| -> Option<(IpAddr, u16)> {
        let (addr, port) = s.split_once(':')?;
        Some((kernel_ip(addr)?.to_canonical(), u16::from_str_radix(port, 16).ok()?))
    };
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let remote = end(f.get(2)?)?;
            (remote.1 != 0).then_some(())?;
            Some(TcpEnds { local: end(f.get(1)?)?, remote, inode: f.get(9)?.parse().ok()? })
        })
        .collect()
}

/// A Unix socket's peer inode, asked of the kernel's socket diagnostics in
/// `pid`'s network namespace (a Unix socket's inode is looked up in the
/// namespace of the netlink socket that asks).
fn unix_peer(pid: u32, inode: u64) -> Option<u64> {
    let ino = u32::try_from(inode).ok()?;
    let diag = in_net_namespace_of(pid, || {
        Socket::new(
            Domain::from(libc::AF_NETLINK),
            Type::DGRAM,
            Some(Protocol::from(libc::NETLINK_SOCK_DIAG)),
        )
        .ok()
    })??;
    diag.set_read_timeout(Some(Duration::from_millis(200))).ok()?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST;
    let mut request = NetlinkMessage::new(
        header,
        SockDiagMessage::UnixRequest(UnixRequest {
            state_flags: StateFlags::all(),
            inode: ino,
            show_flags: ShowFlags::PEER,
            // No cookie: the socket is asked for by its inode alone.
            cookie: [0xff; 8],
        })
        .into(),
    );
    request.finalize();
    let mut buf = vec![0; request.buffer_len()];
    request.serialize(&mut buf);
    // Unaddressed, a netlink message goes to the kernel.
    diag.send(&buf).ok()?;
    let mut reply = [MaybeUninit::<u8>::uninit(); 4096];
    let n = diag.recv(&mut reply).ok()?;
    // SAFETY: recv initialised the first n bytes.
    let bytes: Vec<u8> = reply[..n].iter().map(|b| unsafe { b.assume_init() }).collect();
    let message = NetlinkMessage::<SockDiagMessage>::deserialize(&bytes).ok()?;
    match message.payload {
        NetlinkPayload::InnerMessage(SockDiagMessage::UnixResponse(r)) if r.header.inode == ino => {
            r.peer().filter(|p| *p != 0).map(u64::from)
        }
        _ => None,
    }
}

/// The process a Unix socket's peer credentials name (SO_PEERCRED, asked
/// of a duplicate of `pid`'s descriptor `fd` that pidfd_getfd makes, which
/// the job never sees): the process that connected, or that listened where
/// this one connected (a server's parent, where it forks its workers after
/// listening). None for other sockets, where the kernel keeps no peer.
pub fn peer_pid(pid: u32, fd: i32) -> Option<u32> {
    // SAFETY: plain syscalls; each descriptor they return is owned once.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let pidfd = unsafe { OwnedFd::from_raw_fd(i32::try_from(pidfd).ok().filter(|f| *f >= 0)?) };
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let dup = unsafe { OwnedFd::from_raw_fd(i32::try_from(dup).ok().filter(|f| *f >= 0)?) };
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are what SO_PEERCRED fills.
    let got = unsafe {
        libc::getsockopt(
            dup.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (got == 0 && cred.pid > 0).then_some(cred.pid as u32)
}

/// Runs `f` in `pid`'s network namespace: on this thread where it is ours,
/// else on a thread of its own that enters it (setns changes the calling
/// thread only, and that thread ends with it).
fn in_net_namespace_of<T: Send>(pid: u32, f: impl FnOnce() -> T + Send) -> Option<T> {
    let theirs = fs::metadata(format!("/proc/{pid}/ns/net")).ok()?;
    let ours = fs::metadata("/proc/self/ns/net").ok()?;
    use std::os::unix::fs::MetadataExt;
    if (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino()) {
        return Some(f());
    }
    let ns = fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on an open namespace file, for this thread.
            (unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } == 0).then(f)
        })
        .join()
        .ok()
        .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_connections_other_socket_is_the_one_with_its_ends_swapped() {
        // A listener on 127.0.0.1:8080 (inode 100), the client's socket
        // (200, port 51000) and the server's accepted one (300).
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 100 1 0 100 0 0 10 0\n\
   1: 0100007F:C738 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 200 1 0 20 4 30 10 -1\n\
   2: 0100007F:1F90 0100007F:C738 01 00000000:00000000 00:00000000 00000000     0        0 300 1 0 20 4 30 10 -1\n";
        let all = parse_tcp(text);
        assert_eq!(all.len(), 2, "the listener has no peer");
        assert_eq!(other_of(&all, 200), Some(300));
        assert_eq!(other_of(&all, 300), Some(200));
        assert_eq!(other_of(&all, 100), None);
    }

    #[test]
    fn a_dual_stack_servers_end_matches_its_ipv4_client() {
        let v4 = "  sl  local rem st\n   1: 0100007F:C738 0100007F:1F90 01 0:0 0:0 0 0 0 200 1\n";
        let v6 = "  sl  local rem st\n   0: 0000000000000000FFFF00000100007F:1F90 0000000000000000FFFF00000100007F:C738 01 0:0 0:0 0 0 0 300 1\n";
        let all: Vec<TcpEnds> = parse_tcp(v4).into_iter().chain(parse_tcp(v6)).collect();
        assert_eq!(other_of(&all, 200), Some(300));
    }

    #[test]
    fn a_unix_socket_pairs_peer_is_found_by_the_kernel() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::os::unix::fs::MetadataExt;
        let ino = |s: &std::os::unix::net::UnixStream| {
            fs::metadata(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap().ino()
        };
        // Unprivileged is enough: a process may ask about any Unix socket
        // of its namespace.
        assert_eq!(unix_peer(std::process::id(), ino(&a)), Some(ino(&b)));
        assert_eq!(other_end(std::process::id(), ino(&b)), Some(ino(&a)));
        // A pair made here: both ends' credentials are this process's.
        assert_eq!(peer_pid(std::process::id(), a.as_raw_fd()), Some(std::process::id()));
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(peer_pid(std::process::id(), tcp.as_raw_fd()), None, "no peer credentials for TCP");
    }
}

//! How a trainer fed from outside the job is told: what it reads from (a
//! socket, a pipe), and where the process at the other end is on this
//! host, what that process does.
use stall_common::reason;

use crate::{
    aggregate::ThreadWindow,
    units,
    verdict::classify::{peer_work, PeerWork},
    wait::Party,
};

/// "Trainer main thread blocked 85% of 20s reading a socket to pid 812
/// (featsrv) (1.2 MB at 60 KB/s), woken from outside the job; pid 812
/// (featsrv) at its other end was on CPU 98% of its last 12s: …".
pub(super) fn streamed_in(
    main: &ThreadWindow,
    secs: f64,
    wait: f64,
    bytes: u64,
    network: bool,
    peer: Option<&Party>,
) -> String {
    let from = main
        .wait_object(reason::POLL)
        .map_or_else(|| "a socket or pipe".into(), |o| o.describe().to_string());
    let head = format!(
        "Trainer main thread blocked {} of {} reading {from} ({} at {}), woken from outside the job",
        units::pct(wait),
        units::secs(secs),
        units::bytes(bytes),
        units::rate(bytes, secs),
    );
    let how = if network {
        "its input streams in over the network, and the trainer waits for it"
    } else {
        "its input comes from another program through a pipe, and the trainer waits for it"
    };
    let Some((p, a)) = peer.and_then(|p| Some((p, p.activity?))) else { return format!("{head}: {how}") };
    let cpu = format!("on CPU {} of its last {}", units::pct(a.cpu().min(1.0)), units::secs(a.secs()));
    match peer_work(p) {
        Some(PeerWork::Cpu) => format!(
            "{head}; {p} at its other end was {cpu}: the program that feeds the trainer is CPU-bound, and the trainer waits for it"
        ),
        Some(PeerWork::Storage) => format!(
            "{head}; {p} at its other end read {} from storage in its last {} ({}), {cpu}: the program that feeds the trainer waits on storage, and the trainer waits for it",
            units::bytes(a.storage_read_bytes),
            units::secs(a.secs()),
            units::rate(a.storage_read_bytes, a.secs()),
        ),
        None => format!(
            "{head}; {p} at its other end was {cpu}, reading nothing from storage: it sends at its own pace (a rate limit, or a wait of its own), and the trainer waits for it"
        ),
    }
}

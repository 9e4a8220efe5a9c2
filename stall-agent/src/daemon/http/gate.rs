//! Password checks that cannot starve the server. bcrypt is slow by design
//! (about 60 ms at cost 10), so each check runs on the blocking pool, two
//! at a time and with a bounded queue; the serving thread only waits for
//! the answer, and `/healthz` never meets a check at all. A header that
//! passed is remembered for a while (a scrape every few seconds pays no
//! hash), and a client whose passwords fail waits longer before each next
//! check, without holding a slot meanwhile.
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use ring::{digest, rand::SecureRandom};
use tokio::{sync::Semaphore, time::Instant};

use crate::daemon::web_config::{Access, WebConfig};

/// Checks that run at once: two cores' worth at most, whatever the load.
const CHECKS_AT_ONCE: usize = 2;
/// Checks that may wait for a slot; past it a request is refused at once
/// (503): a queue of seconds helps no client.
const CHECKS_QUEUED: usize = 64;
/// Headers that passed, remembered at most, and for how long.
const ACCEPTED_MAX: usize = 256;
const ACCEPTED_FOR: Duration = Duration::from_secs(300);
/// Clients whose failures are remembered at most, and for how long after
/// the last one.
const CLIENTS_MAX: usize = 4096;
const FAILURES_FOR: Duration = Duration::from_secs(600);
/// The wait before a client's next check doubles with each failure, from
/// the first to the longest.
const PENALTY_FIRST: Duration = Duration::from_millis(100);
const PENALTY_MAX: Duration = Duration::from_secs(2);
/// A client that would have to wait longer than this is refused (429) now,
/// so that its connections do not pile up waiting.
const WAIT_MAX: Duration = Duration::from_secs(5);

/// How a request fares at the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Checked(Access),
    /// The client failed too often lately: it may try again after this.
    Throttled(Duration),
    /// Too many checks are queued.
    Overloaded,
}

pub struct Gate {
    web: Arc<WebConfig>,
    /// Salted so that a header's digest in memory is of no use elsewhere.
    salt: [u8; 16],
    accepted: Mutex<HashMap<[u8; 32], Instant>>,
    slots: Semaphore,
    queued: AtomicUsize,
    failures: Mutex<HashMap<Client, Failures>>,
}

/// A client as its failures are counted: its IPv4 address, or the /64 of
/// its IPv6 one (a host there may hold all of it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Client(u128);

impl From<IpAddr> for Client {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Client(u128::from(v4.to_bits())),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Client(u128::from(v4.to_bits())),
                None => Client(v6.to_bits() & !u128::from(u64::MAX)),
            },
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
    /// The next check may start then, not earlier.
    next: Instant,
}

fn penalty(failures: u32) -> Duration {
    match failures {
        0 => Duration::ZERO,
        n => PENALTY_FIRST.saturating_mul(1 << (n - 1).min(16)).min(PENALTY_MAX),
    }
}

impl Gate {
    pub fn new(web: Arc<WebConfig>) -> Self {
        let mut salt = [0u8; 16];
        // A fixed salt only weakens the digests kept in memory; no failure
        // of the system's random source should stop the daemon for it.
        let _ = ring::rand::SystemRandom::new().fill(&mut salt);
        Self {
            web,
            salt,
            accepted: Mutex::new(HashMap::new()),
            slots: Semaphore::new(CHECKS_AT_ONCE),
            queued: AtomicUsize::new(0),
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Checks a request's `Authorization` header, from `client`.
    pub async fn admit(&self, client: IpAddr, authorization: Option<&str>) -> Admission {
        if !self.web.needs_password() {
            return Admission::Checked(self.web.without_password());
        }
        let Some(header) = authorization else { return Admission::Checked(Access::Denied) };
        let digest = self.digest(header);
        if self.remembered(&digest) {
            return Admission::Checked(Access::Authenticated);
        }
        let client = Client::from(client);
        match self.turn(client, Instant::now()) {
            Err(retry) => return Admission::Throttled(retry),
            Ok(Some(at)) => tokio::time::sleep_until(at).await,
            Ok(None) => {}
        }
        let Some(passed) = self.check(header).await else { return Admission::Overloaded };
        if passed {
            self.remember(digest);
            Admission::Checked(Access::Authenticated)
        } else {
            self.failed(client, Instant::now());
            Admission::Checked(Access::Denied)
        }
    }

    fn digest(&self, header: &str) -> [u8; 32] {
        let mut ctx = digest::Context::new(&digest::SHA256);
        ctx.update(&self.salt);
        ctx.update(header.as_bytes());
        let mut out = [0u8; 32];
        out.copy_from_slice(ctx.finish().as_ref());
        out
    }

    fn remembered(&self, digest: &[u8; 32]) -> bool {
        let accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        accepted.get(digest).is_some_and(|until| *until > Instant::now())
    }

    fn remember(&self, digest: [u8; 32]) {
        let now = Instant::now();
        let mut accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        if accepted.len() >= ACCEPTED_MAX {
            accepted.retain(|_, until| *until > now);
        }
        if accepted.len() >= ACCEPTED_MAX {
            if let Some(oldest) = accepted.iter().min_by_key(|(_, until)| **until).map(|(d, _)| *d) {
                accepted.remove(&oldest);
            }
        }
        accepted.insert(digest, now + ACCEPTED_FOR);
    }

    /// When `client` may be checked: now (`None`), at an instant (its turn
    /// is taken, so that its waiting requests go one at a time), or not
    /// before the given wait is over.
    fn turn(&self, client: Client, now: Instant) -> Result<Option<Instant>, Duration> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let Some(f) = failures.get_mut(&client) else { return Ok(None) };
        if now.duration_since(f.last) > FAILURES_FOR {
            failures.remove(&client);
            return Ok(None);
        }
        let at = f.next.max(now);
        if at.duration_since(now) > WAIT_MAX {
            return Err(at.duration_since(now));
        }
        f.next = at + penalty(f.count);
        Ok((at > now).then_some(at))
    }

    fn failed(&self, client: Client, now: Instant) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= CLIENTS_MAX && !failures.contains_key(&client) {
            failures.retain(|_, f| now.duration_since(f.last) <= FAILURES_FOR);
            if failures.len() >= CLIENTS_MAX {
                if let Some(oldest) = failures.iter().min_by_key(|(_, f)| f.last).map(|(c, _)| *c) {
                    failures.remove(&oldest);
                }
            }
        }
        let f = failures.entry(client).or_insert(Failures { count: 0, last: now, next: now });
        f.count = f.count.saturating_add(1);
        f.last = now;
        f.next = f.next.max(now + penalty(f.count));
    }

    /// bcrypt on the blocking pool, in a slot; `None` when the queue is full.
    async fn check(&self, header: &str) -> Option<bool> {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= CHECKS_QUEUED {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        let slot = self.slots.acquire().await;
        self.queued.fetch_sub(1, Ordering::Relaxed);
        let _slot = slot.ok()?;
        let (web, header) = (self.web.clone(), header.to_string());
        Some(
            tokio::task::spawn_blocking(move || {
                behind_serving();
                web.verify(&header)
            })
            .await
            .unwrap_or(false),
        )
    }
}

/// Lowers the calling thread's priority (nice 10) so that a flood of
/// password checks, each tens of milliseconds of CPU, takes the CPU after
/// the serving threads: scrapes and probes answer first. The pool's threads
/// serve nothing else; a failure leaves the thread as it was.
fn behind_serving() {
    // SAFETY: plain syscalls on the calling thread (on Linux, PRIO_PROCESS
    // of a thread id names that thread alone).
    unsafe {
        let tid = libc::gettid();
        if libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t) < CHECK_NICE {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, CHECK_NICE);
        }
    }
}

/// The password checks' nice value.
const CHECK_NICE: i32 = 10;

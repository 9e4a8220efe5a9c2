//! What wakes stall up: ring-buffer records, the drain and interval ticks,
//! and the signals that end it. Session and daemon loop on [`Feed::next`].
use std::{
    os::fd::{AsRawFd, OwnedFd},
    sync::OnceLock,
    time::Duration,
};

use anyhow::{Context, Result};
use nix::sys::signal::Signal;
use tokio::{
    io::unix::AsyncFd,
    time::{interval_at, Instant, Interval, MissedTickBehavior},
};

use crate::{
    capture::{Capture, DRAIN_EVERY},
    decode::JobEvent,
};

/// Why [`Feed::next`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Decoded events are waiting in [`Feed::events`].
    Events,
    /// An interval has passed.
    Tick,
    /// SIGINT, SIGTERM or SIGHUP.
    Signal(Received),
}

/// A signal that ends stall (or that `stall run` passes on), and where it
/// came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    pub signal: Signal,
    /// Sent by the kernel (`SI_KERNEL`) rather than by a process: the
    /// terminal's Ctrl-C, Ctrl-\ or hangup, which the kernel delivers to the
    /// whole foreground process group at once.
    pub by_kernel: bool,
}

/// The signals stall handles.
const SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];
/// Marks a byte in the signal pipe as sent by the kernel.
const BY_KERNEL: u8 = 0x80;

/// The read end of the pipe the handlers write one byte per signal to
/// (the signal number, [`BY_KERNEL`] added); installed once per process.
fn signal_pipe() -> Result<&'static OwnedFd> {
    static PIPE: OnceLock<OwnedFd> = OnceLock::new();
    if let Some(r) = PIPE.get() {
        return Ok(r);
    }
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
        .context("signal pipe")?;
    // The handlers keep the write end for the life of the process.
    let wfd = std::mem::ManuallyDrop::new(write).as_raw_fd();
    for sig in SIGNALS {
        let signo = sig as i32;
        // SAFETY: the handler only reads siginfo and write(2)s one byte,
        // both async-signal-safe; a full pipe drops the byte (the pipe then
        // already holds a wake-up).
        unsafe {
            signal_hook_registry::register_sigaction(signo, move |info: &libc::siginfo_t| {
                let kernel = if info.si_code == libc::SI_KERNEL { BY_KERNEL } else { 0 };
                let byte = [signo as u8 | kernel];
                libc::write(wfd, byte.as_ptr().cast(), 1);
            })
        }
        .with_context(|| format!("{sig} handler"))?;
    }
    Ok(PIPE.get_or_init(|| read))
}

fn decode_signal(byte: u8) -> Option<Received> {
    let signal = Signal::try_from(i32::from(byte & !BY_KERNEL)).ok()?;
    Some(Received { signal, by_kernel: byte & BY_KERNEL != 0 })
}

pub struct Feed {
    /// Events decoded and not yet handed to a job.
    pub events: Vec<JobEvent>,
    drain: Interval,
    tick: Interval,
    signals: AsyncFd<i32>,
}

impl Feed {
    /// Set up first, before anything is loaded: a signal during start-up
    /// must still end in a clean exit. The clocks run from [`Feed::start`].
    pub fn new(interval: Duration) -> Result<Self> {
        let every = |period: Duration| {
            let mut i = interval_at(Instant::now() + period, period);
            i.set_missed_tick_behavior(MissedTickBehavior::Delay);
            i
        };
        Ok(Self {
            events: Vec::new(),
            drain: every(DRAIN_EVERY),
            tick: every(interval),
            // SAFETY: the pipe's read end lives as long as the process.
            signals: unsafe { AsyncFd::register(signal_pipe()?.as_raw_fd()) }.context("signal pipe")?,
        })
    }

    /// Starts the clocks: the first tick one interval from now. Loading the
    /// programs can take seconds (an old verifier, an emulated CPU), and the
    /// first interval must not be cut short by it.
    pub fn start(&mut self) {
        self.drain.reset();
        self.tick.reset();
    }

    /// Waits for the next thing to do. Cancel-safe: a caller may select on
    /// it next to its own futures (a child's exit, a deadline).
    pub async fn next(&mut self, capture: &mut Capture) -> Result<Wake> {
        Ok(tokio::select! {
            r = capture.next_events(&mut self.events) => {
                r.context("reading the ring buffer")?;
                Wake::Events
            }
            _ = self.drain.tick() => {
                // Records that did not reach the wake-up threshold (a
                // batch; more are read at the next wake).
                capture.drain_events(&mut self.events);
                Wake::Events
            }
            _ = self.tick.tick() => Wake::Tick,
            r = Self::next_signal(&self.signals) => Wake::Signal(r?),
        })
    }

    /// The next signal from the pipe, one per call.
    async fn next_signal(fd: &AsyncFd<i32>) -> Result<Received> {
        loop {
            let mut guard = fd.readable().await.context("signal pipe")?;
            let mut byte = [0u8; 1];
            // SAFETY: reads one byte into a local buffer.
            let n = unsafe { libc::read(*fd.get_ref(), byte.as_mut_ptr().cast(), 1) };
            if n == 1 {
                if let Some(r) = decode_signal(byte[0]) {
                    return Ok(r);
                }
                continue;
            }
            guard.clear_ready();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_bytes_say_where_they_came_from() {
        let term = decode_signal(libc::SIGTERM as u8).unwrap();
        assert_eq!(term, Received { signal: Signal::SIGTERM, by_kernel: false });
        let tty = decode_signal(libc::SIGINT as u8 | BY_KERNEL).unwrap();
        assert_eq!(tty, Received { signal: Signal::SIGINT, by_kernel: true });
        assert!(decode_signal(0).is_none());
    }
}

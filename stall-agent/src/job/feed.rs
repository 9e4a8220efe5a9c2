//! What wakes stall up: ring-buffer records, the drain and interval ticks,
//! and the signals that end it. Session and daemon loop on [`Feed::next`].
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::{
    signal::unix::{signal, Signal, SignalKind},
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
    Interrupt,
    Terminate,
    Hangup,
}

pub struct Feed {
    /// Events decoded and not yet handed to a job.
    pub events: Vec<JobEvent>,
    drain: Interval,
    tick: Interval,
    sigint: Signal,
    sigterm: Signal,
    sighup: Signal,
}

impl Feed {
    /// Set up first, before anything is loaded: a signal during start-up
    /// must still end in a clean exit. The first tick comes one `interval`
    /// from now.
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
            sigint: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            sigterm: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            sighup: signal(SignalKind::hangup()).context("SIGHUP handler")?,
        })
    }

    /// Starts the interval clock again from now: called once attached, so
    /// that the first interval is one whole interval of tracing, however
    /// long loading took (about 0.9 s under emulation; a tick missed
    /// meanwhile would otherwise fire at once).
    pub fn attached(&mut self) {
        self.tick.reset();
        self.drain.reset();
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
                // Records that did not reach the wake-up threshold.
                capture.drain_events(&mut self.events);
                Wake::Events
            }
            _ = self.tick.tick() => Wake::Tick,
            _ = self.sigint.recv() => Wake::Interrupt,
            _ = self.sigterm.recv() => Wake::Terminate,
            _ = self.sighup.recv() => Wake::Hangup,
        })
    }
}

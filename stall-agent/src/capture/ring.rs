//! The ring buffer's records (opens, forks, execs, exits, closes, switches
//! for the timeline), decoded as they come.
use std::os::fd::AsRawFd;

use super::Capture;
use crate::decode::{self, JobEvent};

/// How often the agent drains the ring buffer when no wakeup came (the
/// kernel side wakes it only once 1/8 of the ring is waiting).
pub const DRAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

impl Capture {
    /// Waits until the ring buffer has records, then decodes all of them.
    pub async fn next_events(&mut self, out: &mut Vec<JobEvent>) -> std::io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        let ring = guard.get_inner_mut();
        while let Some(item) = ring.next() {
            match decode::decode(&item) {
                Ok(ev) => out.push(ev),
                Err(_) => self.decode_errors += 1,
            }
        }
        guard.clear_ready();
        Ok(())
    }

    /// Decodes whatever is in the ring buffer now, without waiting.
    pub fn drain_events(&mut self, out: &mut Vec<JobEvent>) {
        let ring = self.ring.get_mut();
        while let Some(item) = ring.next() {
            match decode::decode(&item) {
                Ok(ev) => out.push(ev),
                Err(_) => self.decode_errors += 1,
            }
        }
    }

    pub fn ring_fd(&self) -> i32 {
        self.ring.get_ref().as_raw_fd()
    }
}

//! The ring buffer's records (opens, forks, execs, exits, closes, switches
//! for the timeline), decoded as they come.
use std::os::fd::AsRawFd;

use super::Capture;
use crate::decode::{self, JobEvent};

/// How often the agent drains the ring buffer when no wakeup came (the
/// kernel side wakes it only once 1/8 of the ring is waiting).
pub const DRAIN_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// Records decoded at most per call: the rest waits for the caller's next
/// call, so that a storm of records (a fork storm fills the ring as fast as
/// it is read) never holds more than this many decoded at once.
pub const MAX_BATCH: usize = 8192;

impl Capture {
    /// Waits until the ring buffer has records, then decodes them, at most
    /// [`MAX_BATCH`] (readiness stays set while more are waiting).
    pub async fn next_events(&mut self, out: &mut Vec<JobEvent>) -> std::io::Result<()> {
        let mut guard = self.ring.readable_mut().await?;
        if let Some(l) = self.kernel_log.as_mut() {
            l.flush();
        }
        if !Self::decode_some(guard.get_inner_mut(), out, &mut self.decode_errors) {
            guard.clear_ready();
        }
        Ok(())
    }

    /// Decodes what is in the ring buffer now, at most [`MAX_BATCH`] records,
    /// without waiting; whether more are left.
    pub fn drain_events(&mut self, out: &mut Vec<JobEvent>) -> bool {
        if let Some(l) = self.kernel_log.as_mut() {
            l.flush();
        }
        Self::decode_some(self.ring.get_mut(), out, &mut self.decode_errors)
    }

    /// Decodes up to [`MAX_BATCH`] records; whether it stopped at the limit.
    fn decode_some(
        ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
        out: &mut Vec<JobEvent>,
        errors: &mut u64,
    ) -> bool {
        for _ in 0..MAX_BATCH {
            let Some(item) = ring.next() else { return false };
            match decode::decode(&item) {
                Ok(ev) => out.push(ev),
                Err(_) => *errors += 1,
            }
        }
        true
    }

    pub fn ring_fd(&self) -> i32 {
        self.ring.get_ref().as_raw_fd()
    }
}

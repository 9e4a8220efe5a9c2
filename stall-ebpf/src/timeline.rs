//! Per-switch records for the timeline (`--timeline`, or one job's on
//! demand): only when asked for, only for tracked threads; a full ring
//! buffer is counted as a loss.
use stall_common::{counter, event_kind, Config, SwitchEvent, ThreadStats};

use crate::{
    bump, header,
    maps::{EVENTS, TIMELINE_JOB},
    submit_flags,
};

/// A tracked thread left the CPU (`t` already says why) or came on it (`t`
/// still holds when it was woken).
#[inline(always)]
pub(crate) fn record(cfg: &Config, t: &ThreadStats, tid: u32, on: bool, ts: u64) {
    if cfg.timeline == 0 && TIMELINE_JOB.get(0).is_none_or(|&job| job == 0 || job != t.job) {
        return;
    }
    match EVENTS.reserve::<SwitchEvent>(0) {
        Some(mut e) => {
            e.write(SwitchEvent {
                hdr: header(event_kind::SWITCH, tid, t.tgid, t.job, ts),
                wake_ts: if on { t.wake_ts } else { 0 },
                exec_ns: t.exec_ns,
                nr: if on { -1 } else { t.off_nr },
                reason: if on { 0 } else { t.off_reason },
                on: u8::from(on),
                _pad: [0; 2],
            });
            e.submit(submit_flags(cfg));
        }
        None => bump(counter::LOST_RINGBUF),
    }
}

//! How a wait for a child is told: the children it goes through and what
//! the ones at its end do, with the bytes where they write or read.
use stall_common::reason;

use super::{reason_name, source::from_storage, top_sent_peer};
use crate::{aggregate::ProcWindow, units, verdict::child::ChildWait};

/// "Trainer main thread blocked 83% of 3.6s waiting for its child pid 812
/// (sh -c …), which waits for its child pid 813 (python3 eval.py), on CPU
/// 97%: …".
pub(super) fn waits_for_children(c: &ChildWait, secs: f64) -> String {
    let mut chain = String::new();
    let mut whose = "its";
    for level in &c.via {
        let verb = if level.len() == 1 { "waits" } else { "wait" };
        chain += &format!("{}, which {verb} for ", children_of(whose, level));
        whose = if level.len() == 1 { "its" } else { "their" };
    }
    chain += &children_of(whose, &c.children);
    let head = format!(
        "Trainer main thread blocked {} of {} waiting for {chain}",
        units::pct(c.waits),
        units::secs(secs)
    );
    let Some(state) = c.state else {
        return format!(
            "{head}, on CPU {}: the trainer waits for work the host does in a subprocess",
            units::pct(c.share)
        );
    };
    let first = c.children[0];
    let on = c.threads.iter().find_map(|t| t.wait_object(state)).map(|o| o.describe().to_string());
    let sum = |f: fn(&ProcWindow) -> u64| c.children.iter().map(|p| f(p)).sum::<u64>();
    match state {
        reason::SEND | reason::WRITE | reason::SYNC => {
            let (bytes, what) = if state == reason::SEND {
                let peer = || top_sent_peer(first).map(|p| format!("the socket to {p}"));
                (sum(|p| p.sum().other_write_bytes), on.or_else(peer).unwrap_or_else(|| "a pipe or socket".into()))
            } else {
                (sum(|p| p.sum().file_write_bytes), on.unwrap_or_else(|| "files".into()))
            };
            let verb = if state == reason::SYNC { "syncing" } else { "writing" };
            format!(
                "{head}, blocked {} {verb} {what} ({} at {}): whoever takes its output is slow, and the trainer waits for it",
                units::pct(c.share),
                units::bytes(bytes),
                units::rate(bytes, secs),
            )
        }
        reason::SLEEP => format!(
            "{head}, asleep {} of its time (a rate limit, a back-off, a poll interval): the trainer waits on its sleeps",
            units::pct(c.share),
        ),
        reason::IO => {
            let bytes = sum(ProcWindow::input_bytes);
            format!(
                "{head}, blocked {} in file reads of {} at {}{}: the trainer waits on its reads",
                units::pct(c.share),
                units::bytes(bytes),
                units::rate(bytes, secs),
                from_storage(&c.children, bytes),
            )
        }
        _ => format!(
            "{head}, blocked {} ({}{}): the trainer waits on what its child waits for",
            units::pct(c.share),
            c.threads.first().map_or_else(|| reason::name(state).to_string(), |t| reason_name(state, t)),
            on.map(|o| format!(" on {o}")).unwrap_or_default(),
        ),
    }
}

/// "its child pid 813 (python3 eval.py)", or "their 3 children, one after
/// another (the longest pid 813 (python3 eval.py))".
fn children_of(whose: &str, children: &[&ProcWindow]) -> String {
    match children {
        [one] => format!("{whose} child {}", named(one)),
        all => format!("{whose} {} children, one after another (the longest {})", all.len(), named(all[0])),
    }
}

/// "pid 813 (python3 eval.py --split val)": its command line on one line,
/// cut short.
fn named(p: &ProcWindow) -> String {
    const MAX_CHARS: usize = 60;
    let Some(cmdline) = p.cmdline.as_deref() else {
        return format!("pid {} ({})", p.tgid, crate::detail::Name::from(p.comm.as_str()));
    };
    let one_line = cmdline.split_whitespace().collect::<Vec<_>>().join(" ");
    let what = match one_line.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    };
    format!("pid {} ({})", p.tgid, crate::detail::Command::from(what))
}

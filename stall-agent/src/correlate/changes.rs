//! When the trainer's role moves from one process to another (a shim or a
//! shell stood for the job before its interpreter ran, a launcher before
//! its ranks came, a program exec'd or ended), and why: said in the report
//! and the JSON, so that a verdict whose trainer changed can be read
//! against the one before. Pure.
use serde::Serialize;

use super::{evidence::Evidence, Role, Roles, TrainerRule};
use crate::aggregate::Window;

/// The trainers changed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RoleChange {
    /// Seconds since tracing began.
    pub at_s: f64,
    pub from: Vec<u32>,
    pub to: Vec<u32>,
    /// What made the new trainers so.
    pub rule: TrainerRule,
    /// What became of each former trainer, and what the new ones are, in
    /// words.
    pub says: String,
}

/// The change from the trainers `before` to those of `now` (assigned over
/// `w`), if any, `at_s` seconds into tracing. No trainer before is no
/// change: the first assignment is no news.
pub fn change(before: &[u32], now: &Roles, w: &Window, at_s: f64) -> Option<RoleChange> {
    if before.is_empty() || before == now.trainers.as_slice() {
        return None;
    }
    let ev = Evidence::of(w);
    let name = |t: u32| match w.proc(t) {
        Some(p) => format!("pid {t} ({})", p.comm),
        None => format!("pid {t}"),
    };
    let gone: Vec<String> = before
        .iter()
        .filter(|t| !now.trainers.contains(t))
        .map(|&t| {
            let fate = match w.proc(t) {
                None => "left the job",
                Some(p) if !p.alive => "ended",
                Some(_) if ev.is_wrapper(t) => "only waits for its child",
                Some(_) if ev.of_a_replaced_program(t) => "belongs to a program that exec'd since",
                Some(_) if now.of(t) == Role::Worker => "works for the trainer",
                Some(_) => "gave way to stronger evidence",
            };
            format!("{} {fate}", name(t))
        })
        .collect();
    let new: Vec<String> = now.trainers.iter().map(|&t| name(t)).collect();
    let which = if new.len() == 1 { "which" } else { "which each" };
    let now_said = format!("{}: {}, {which} {}", trainers_word(new.len()), new.join(", "), now.rule.says());
    let says = if gone.is_empty() { now_said } else { format!("{}; {now_said}", gone.join(", ")) };
    Some(RoleChange { at_s, from: before.to_vec(), to: now.trainers.clone(), rule: now.rule, says })
}

fn trainers_word(n: usize) -> &'static str {
    if n == 1 {
        "the trainer now"
    } else {
        "the trainers now"
    }
}

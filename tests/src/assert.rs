//! Checks of stall's figures against ground truth, within tolerances.

use crate::workload::{blocked_s, secs};
use serde_json::Value;

/// |got - want| <= tol * want
pub fn assert_close(what: &str, got: f64, want: f64, tol: f64) {
    assert!(
        (got - want).abs() <= tol * want,
        "{what}: got {got:.4}, want {want:.4} within {:.0}%",
        tol * 100.0
    );
}

/// The futex off-CPU time stall counts for the `waits` job's futexer:
/// its measured wait within `tol`, plus at most what its whole life held
/// outside the measured window (the GIL is a futex too: the thread waits
/// for it before the window opens and after it closes).
pub fn assert_futex_wait(what: &str, got: f64, truth: &Value, tol: f64) {
    let want = blocked_s(truth, "futex");
    let outside = (secs(&truth["futex_life_s"]) - secs(&truth["futex_s"])).max(0.0);
    assert!(
        got >= want * (1.0 - tol) && got <= want * (1.0 + tol) + outside,
        "{what}: got {got:.4}, want {want:.4} within {:.0}% (+ up to {outside:.4} of the thread's life outside its wait)",
        tol * 100.0
    );
}

/// A whole thread's total that stall counts to the thread's end, against
/// the kernel's figure read by the thread shortly before it ended: `got`
/// is at least `at_read` and at most `at_read` plus the `tail` the thread
/// lived on after the read, each within `tol`.
pub fn assert_thread_total(what: &str, got: f64, at_read: f64, tail: f64, tol: f64) {
    assert!(
        got >= at_read * (1.0 - tol) && got <= (at_read + tail) * (1.0 + tol),
        "{what}: got {got:.4}, want {at_read:.4} (+ up to {tail:.4} after the read) within {:.0}%",
        tol * 100.0
    );
}

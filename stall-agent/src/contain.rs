//! Reads of a live process's memory (its Python interpreter, its
//! environment) parse what another program is changing underneath: a
//! library that trusts that memory can panic on it (an overflowing shift on
//! a garbage length, an index past a torn array). Such a read costs that
//! read, never the agent: [`contained`] turns its panic into an error, and
//! keeps the panic's message off stderr (it says nothing the caller's note
//! does not).
use std::{
    cell::Cell,
    panic::{self, AssertUnwindSafe},
    sync::Once,
};

thread_local! {
    /// Set while this thread runs a contained read.
    static CONTAINING: Cell<bool> = const { Cell::new(false) };
}

static QUIET_HOOK: Once = Once::new();

/// Runs `read`, and returns the message of any panic inside it as an error.
/// `read` must leave nothing of the caller's half-changed when it panics:
/// what it used should be dropped after a failure (the caller's duty; a
/// process reader that panicked is not trusted again).
pub fn contained<T>(read: impl FnOnce() -> T) -> Result<T, String> {
    QUIET_HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !CONTAINING.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let outer = CONTAINING.with(|c| c.replace(true));
    let result = panic::catch_unwind(AssertUnwindSafe(read));
    CONTAINING.with(|c| c.set(outer));
    result.map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        format!("the reader failed on what it read ({message})")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_is_an_error_and_the_agent_goes_on() {
        #[allow(arithmetic_overflow, clippy::identity_op)]
        let garbage = || {
            let shift: u32 = std::hint::black_box(70);
            1u64 << shift
        };
        let r = contained(garbage);
        // Debug builds check the shift and panic; release builds wrap.
        if cfg!(debug_assertions) {
            let e = r.unwrap_err();
            assert!(e.contains("overflow"), "{e}");
        }
        assert_eq!(contained(|| 7).unwrap(), 7);
        let e = contained(|| -> u8 { panic!("torn {}", "array") }).unwrap_err();
        assert!(e.contains("torn array"), "{e}");
        // Panics outside a contained read are not swallowed.
        assert!(panic::catch_unwind(|| panic!("outside")).is_err());
        assert!(!CONTAINING.with(Cell::get));
    }

    #[test]
    fn nested_reads_restore_the_outer_state() {
        let r = contained(|| {
            let inner = contained(|| -> u8 { panic!("inner") });
            assert!(inner.is_err());
            CONTAINING.with(Cell::get)
        });
        assert_eq!(r, Ok(true));
    }
}

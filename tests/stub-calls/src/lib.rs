//! What stall's stand-in GPU libraries (`stall-cuda-stub`,
//! `stall-nccl-stub`) share: the calls of each exported function, counted,
//! and the unit tests' check that no two exported functions share an
//! address.
//!
//! Counting also keeps functions with the same body apart: rustc merges
//! identical functions into aliases of one address (`cuStreamSynchronize`
//! would be `cudaStreamSynchronize`), and a uprobe on one would then fire
//! for calls of both.
use std::{
    ffi::{c_char, CStr, CString},
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

/// The index of `name` in `names`. Const, so that a count of a function
/// missing from the library's list fails the build ([`count!`]).
pub const fn index_of(names: &[&str], name: &str) -> usize {
    let mut i = 0;
    while i < names.len() {
        let (a, b) = (names[i].as_bytes(), name.as_bytes());
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not in the exported names")
}

/// Calls of each function of a library's list of exports so far, in the
/// list's order.
pub struct Calls<const N: usize>([AtomicU64; N]);

impl<const N: usize> Calls<N> {
    pub const fn new() -> Self {
        Self([const { AtomicU64::new(0) }; N])
    }

    /// Counts a call of the function at `index`.
    pub fn add(&self, index: usize) {
        self.0[index].fetch_add(1, Ordering::Relaxed);
    }

    /// The calls of the function `name` (a C string) of `names`;
    /// `u64::MAX` for null or a name not among them.
    ///
    /// # Safety
    /// `name` is null or points to a NUL-terminated string.
    pub unsafe fn of_c_name(&self, names: &[&str; N], name: *const c_char) -> u64 {
        if name.is_null() {
            return u64::MAX;
        }
        // SAFETY: checked non-null; NUL-terminated, as the caller promises.
        let name = unsafe { CStr::from_ptr(name) };
        match names.iter().position(|e| e.as_bytes() == name.to_bytes()) {
            Some(i) => self.0[i].load(Ordering::SeqCst),
            None => u64::MAX,
        }
    }
}

impl<const N: usize> Default for Calls<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Counts a call of the exported function `$name` in `$calls`, a
/// [`Calls`] over the list `$names`; a name not in the list fails the
/// build.
#[macro_export]
macro_rules! count {
    ($calls:expr, $names:expr, $name:literal) => {
        $calls.add(const { $crate::index_of(&$names, $name) })
    };
}

/// Asserts that no two of the named addresses are the same.
pub fn assert_distinct(addrs: &[(&str, usize)]) {
    for (i, (a, x)) in addrs.iter().enumerate() {
        for (b, y) in &addrs[i + 1..] {
            assert_ne!(x, y, "{a} and {b} share an address: a uprobe on one would fire for both");
        }
    }
}

/// Asserts that the built library `file` (in the folder above the running
/// test binary's, target/PROFILE/, where cargo puts it) exports each of
/// `names` at an address of its own. Returns false, saying so, where cargo
/// has not built the library there.
pub fn assert_library_distinct(file: &str, names: &[&str]) -> bool {
    let exe = std::env::current_exe().expect("the test binary's path");
    let so = exe.parent().and_then(Path::parent).expect("target/PROFILE/deps").join(file);
    if !so.exists() {
        eprintln!("{} not built: only the test binary's functions checked", so.display());
        return false;
    }
    let path = CString::new(so.to_string_lossy().as_bytes()).expect("a path without NUL");
    // SAFETY: a NUL-terminated path; the library's constructors are Rust's.
    let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!lib.is_null(), "dlopen {}", so.display());
    let mut addrs = Vec::new();
    for &name in names {
        let c = CString::new(name).expect("a name without NUL");
        // SAFETY: a live handle and a NUL-terminated name.
        let sym = unsafe { libc::dlsym(lib, c.as_ptr()) };
        assert!(!sym.is_null(), "{name} is not exported by {}", so.display());
        addrs.push((name, sym as usize));
    }
    assert_distinct(&addrs);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 3] = ["cuInit", "cuInitX", "cuCtxSynchronize"];

    #[test]
    fn names_are_found_whole() {
        assert_eq!(index_of(&NAMES, "cuInit"), 0);
        assert_eq!(index_of(&NAMES, "cuInitX"), 1);
        assert_eq!(index_of(&NAMES, "cuCtxSynchronize"), 2);
    }

    #[test]
    fn calls_are_counted_by_c_name() {
        static CALLS: Calls<3> = Calls::new();
        count!(CALLS, NAMES, "cuInitX");
        count!(CALLS, NAMES, "cuInitX");
        // SAFETY: NUL-terminated names, and null.
        unsafe {
            assert_eq!(CALLS.of_c_name(&NAMES, c"cuInitX".as_ptr()), 2);
            assert_eq!(CALLS.of_c_name(&NAMES, c"cuInit".as_ptr()), 0);
            assert_eq!(CALLS.of_c_name(&NAMES, c"cuNoSuchThing".as_ptr()), u64::MAX);
            assert_eq!(CALLS.of_c_name(&NAMES, std::ptr::null()), u64::MAX);
        }
    }

    #[test]
    #[should_panic(expected = "share an address")]
    fn a_shared_address_is_refused() {
        assert_distinct(&[("a", 1), ("b", 2), ("c", 1)]);
    }
}

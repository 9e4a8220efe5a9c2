//! Scratch space: directories removed on drop, on a tmpfs or on a disk,
//! and unique temporary file names.

use std::path::PathBuf;

/// A scratch directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        let base = std::env::var_os("STALL_TEST_TMP").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        let dir = base.join(format!("stall-it-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    /// A file of `size` random-ish bytes.
    pub fn file(&self, name: &str, size: usize) -> PathBuf {
        let p = self.path(name);
        let mut data = vec![0u8; size];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ size as u64;
        for b in data.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        std::fs::write(&p, data).unwrap();
        p
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A scratch directory on a block device, so that blkio can throttle reads of
/// the files in it: $STALL_TEST_TMP, else /var/tmp (not a tmpfs).
pub fn disk_scratch(tag: &str) -> Scratch {
    let base = std::env::var_os("STALL_TEST_TMP").map(PathBuf::from).unwrap_or_else(|| "/var/tmp".into());
    let dir = base.join(format!("stall-it-scn-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

pub fn tempfile_path(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "stall-it-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

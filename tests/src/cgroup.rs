//! cgroup v2 for the tests: where it is mounted, a test's own cgroups
//! (removed on drop), and whole trees.

use std::path::{Path, PathBuf};

/// Where cgroup v2 is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on
/// hybrid systems). Panics without one: the cgroup tests cannot run.
pub fn cgroup2_mount() -> PathBuf {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .find_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            if post.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(pre.split_whitespace().nth(4)?))
        })
        .expect("no cgroup2 mount on this machine")
}

/// A cgroup v2 directory for one test, removed when dropped (once its
/// tasks are gone; children first, as they drop first).
pub struct Cgroup {
    pub dir: PathBuf,
    /// Relative to the cgroup2 mount, as users type it.
    pub name: String,
}

impl Cgroup {
    /// `stall-it-TAG-PID` at the top of the cgroup2 mount.
    pub fn new(tag: &str) -> Self {
        Self::create(cgroup2_mount(), format!("stall-it-{tag}-{}", std::process::id()))
    }

    /// `name` (a path relative to the cgroup2 mount), exactly so named.
    pub fn at(name: &str) -> Self {
        Self::create(cgroup2_mount(), name.to_string())
    }

    /// A cgroup inside this one.
    pub fn child(&self, name: &str) -> Self {
        Self::create(cgroup2_mount(), format!("{}/{name}", self.name))
    }

    fn create(mount: PathBuf, name: String) -> Self {
        let dir = mount.join(&name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
        Self { dir, name }
    }

    pub fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("moving {pid} into {}: {e}", self.dir.display()));
    }

    /// Removes it, retrying while its last tasks are being torn down.
    pub fn remove(&self) -> bool {
        for _ in 0..100 {
            if !self.dir.exists() || std::fs::remove_dir(&self.dir).is_ok() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Whether a cgroup or any below it holds a task.
pub fn holds_tasks(dir: &Path) -> bool {
    let here = std::fs::read_to_string(dir.join("cgroup.procs")).is_ok_and(|t| !t.trim().is_empty());
    here || std::fs::read_dir(dir)
        .map(|entries| entries.flatten().any(|e| e.path().is_dir() && holds_tasks(&e.path())))
        .unwrap_or(false)
}

/// Removes an empty cgroup tree, children first.
pub fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                remove_tree(&e.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}

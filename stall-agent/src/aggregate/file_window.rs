//! [`FileWindow`]: one file (or a socket's peer) as a window sees it,
//! what a process read, wrote and mapped of it and where the bytes came
//! from.
use super::files::{is_code_file, is_kernel_file, storage_share, PageCache};
use crate::decode::{counters, FileCounters};

counters! {
    /// Regular files merged by path, or connected sockets merged by peer.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct FileWindow {
        // What names it, carried along; the rest is counted: added in a
        // merge, subtracted in `Window::since`.
        keep {
            /// The path, or a socket's peer ("10.0.0.5:443").
            pub path: String,
            /// A connected inet socket: network traffic, never file throughput
            /// (in [`super::ProcWindow::sockets`], not `files`).
            pub socket: bool,
            /// A socket whose peer is a process of the job: IPC, not input.
            pub ipc: bool,
            pub resolved: Option<String>,
            /// The filesystem serving it where its bytes come from a server,
            /// neither a local disk nor memory (`fuse.slowfs`, `nfs4`): none
            /// of them pass the block layer, and what `storage_bytes` counts
            /// is what the server's answers brought into the page cache.
            /// Set by the job from what /proc said while its reader ran.
            pub filesystem: Option<String>,
        }
        pub opens: u64,
        pub read_calls: u64,
        pub read_bytes: u64,
        /// Time in the timed reads (one in `--latency-sample`), and how many.
        pub read_ns: u64,
        pub timed_calls: u64,
        /// Successful writes to it (a log, a checkpoint).
        pub write_bytes: u64,
        pub write_calls: u64,
        /// Time the file was open within the window, summed over its opens:
        /// the per-file rate is over this, not over the whole window.
        pub open_ns: u64,
        /// Bytes of it this process caused to be read from storage (the rest of
        /// what it read came from the page cache); None: not seen here.
        pub storage_bytes: Option<u64>,
        /// Bytes of it this process's faults mapped into it (its pages touched
        /// through a mapping) first of the job's processes; None: not seen
        /// here.
        pub mmap_bytes: Option<u64>,
        /// Bytes of it this process's faults mapped that another process
        /// got mapped just before (in that one's `mmap_bytes`): which of two
        /// workers faults a large folio first is a race, so each worker's
        /// own part is the two together. None: not seen here.
        pub mmap_shared_bytes: Option<u64>,
    }
}

impl FileWindow {
    /// Its path, resolved where it was.
    pub fn name(&self) -> &str {
        self.resolved.as_deref().unwrap_or(&self.path)
    }
    /// A module, a library, an executable: code, not data.
    pub fn is_code(&self) -> bool {
        !self.socket && is_code_file(self.name())
    }

    /// The bytes of it the process took in: read and mapped, or where more
    /// (pages of a mapping where faults are not followed), brought in from
    /// storage. The pages of a program's own code (shared objects, modules)
    /// it runs through a mapping are not input, nor are shared-memory
    /// segments (/dev/shm: semaphores, tensors passed between processes).
    pub fn bytes_in(&self) -> u64 {
        let path = self.resolved.as_deref().unwrap_or(&self.path);
        let mapped = match self.mmap_bytes {
            Some(n) if n > 0 && !is_code_file(path) && !is_kernel_file(path) => n,
            _ => 0,
        };
        // Where its faults are followed, what it mapped is exact: the
        // read-ahead its faults set off is mapped by whoever touches it (a
        // worker faulting a page still being read brings in megabytes its
        // siblings then map from the page cache).
        if mapped > 0 {
            return self.read_bytes + mapped;
        }
        self.read_bytes.max(self.storage_bytes.unwrap_or(0))
    }

    /// How it was taken in: "in 12 reads", "mapped", "in 12 reads and
    /// mapped".
    pub fn taken_by(&self) -> String {
        let reads = format!("in {} reads", self.read_calls);
        match (self.read_calls, self.mmap_bytes.unwrap_or(0)) {
            (_, 0) => reads,
            (0, _) => "mapped".to_string(),
            _ => format!("{reads} and mapped"),
        }
    }

    /// Where those bytes came from, where the kernel shows it: "from the
    /// page cache", "82 % from storage", "from storage (page cache cold)",
    /// each "through a mapping, " first where none was read().
    pub fn source(&self) -> Option<String> {
        if is_kernel_file(self.resolved.as_deref().unwrap_or(&self.path)) {
            return None;
        }
        let storage = self.storage_bytes?;
        let taken = self.read_bytes + self.mmap_bytes.unwrap_or(0);
        let how = if self.read_bytes == 0 { "through a mapping, " } else { "" };
        if taken == 0 {
            return (storage > 0).then(|| format!("{how}from storage"));
        }
        let share = storage_share(storage, taken);
        Some(match PageCache::of(share) {
            Some(PageCache::Warm) => format!("{how}from the page cache"),
            Some(PageCache::Cold) => format!("{how}from storage (page cache cold)"),
            None => format!("{how}{:.0} % from storage", share * 100.0),
        })
    }

    /// Adds one descriptor's counters (an interval's delta, or its total).
    pub fn add_counters(&mut self, c: &FileCounters) {
        self.read_calls += c.read_calls;
        self.read_bytes += c.read_bytes;
        self.read_ns += c.read_ns;
        self.timed_calls += c.timed_calls;
        self.write_bytes += c.write_bytes;
        self.write_calls += c.write_calls;
    }

    /// Mean duration of a read, from the timed ones.
    pub fn mean_read_ns(&self) -> Option<f64> {
        (self.timed_calls > 0).then(|| self.read_ns as f64 / self.timed_calls as f64)
    }

    /// Time spent in all its reads, estimated from the timed ones.
    pub fn read_time_ns(&self) -> f64 {
        self.mean_read_ns().map_or(0.0, |m| m * self.read_calls as f64)
    }

    /// Seconds to divide its bytes by: the time it was open in a window of
    /// `window_s` (the whole window for files open throughout or unknown,
    /// and for bytes through a mapping).
    pub fn rate_secs(&self, window_s: f64) -> f64 {
        // A mapping is read long after its descriptor closed.
        if self.open_ns > 0 && self.read_bytes >= self.bytes_in() {
            (self.open_ns as f64 / 1e9).min(window_s)
        } else {
            window_s
        }
    }
}

#[cfg(test)]
mod tests;

//! Aggregation: the job's processes, threads, files and wakeups as an
//! incremental [`Model`] fed by decoded events and map snapshots, cut into
//! [`Window`]s (an interval, the last few seconds, the whole run) for the
//! correlation and the verdict. Pure: no kernel, no /proc.
mod model;
mod window;

pub use model::{File, Model, Proc, Thread, MAX_ENDED};
pub use window::{
    is_code_file, is_kernel_file, push_recent, storage_share, CpuLimitWindow, FdWait, FileWindow, PageCache,
    ProcWindow, ThreadWindow, Waker, Window, DATA_MIN_BYTES, MAX_ENDED_PER_WINDOW, MAX_WAKERS, RECENT_NS,
};

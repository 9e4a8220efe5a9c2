//! Aggregation: the job's processes, threads, files and wakeups as an
//! incremental [`Model`] fed by decoded events and map snapshots, cut into
//! [`Window`]s (an interval, the last few seconds, the whole run) for the
//! correlation and the verdict. Pure: no kernel, no /proc.
mod collectives;
mod file_window;
mod files;
mod model;
mod window;

pub use collectives::{ArrivalCounts, Arrivals};
pub use file_window::FileWindow;
pub use files::{is_code_file, is_data_file, is_kernel_file, storage_share, PageCache};
pub use model::{File, Model, Proc, Thread, MAX_ENDED};
pub use window::{
    push_recent, CpuLimitWindow, FdWait, ProcWindow, ThreadWindow, Waker, Window, DATA_MIN_BYTES,
    MAX_ENDED_PER_WINDOW, MAX_WAKERS, RECENT_NS,
};

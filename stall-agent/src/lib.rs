//! stall's agent. The data path, one module per step:
//! kernel events → [`capture`] → [`decode`] → [`aggregate`] → [`correlate`]
//! and [`progress`] → [`verdict`] → [`output`]. A [`job`] holds one traced job along that
//! path; [`session`] (`run`, `attach`) drives one, [`daemon`] one per cgroup.
pub mod aggregate;
pub mod caps;
pub mod capture;
pub mod cli;
pub mod clock;
pub mod contain;
pub mod correlate;
pub mod cpulimit;
pub mod daemon;
pub mod decode;
pub mod detail;
pub mod error;
pub mod exit;
pub mod gpu;
pub mod job;
pub mod output;
pub mod progress;
pub mod pystack;
pub mod rank;
pub mod session;
pub mod syscalls;
pub mod timeline;
pub mod units;
pub mod verdict;
pub mod wait;

//! Helpers for stall's privileged integration tests: they run the real
//! `stall` binary on the running kernel against workloads whose ground truth
//! is known, and read its JSON summary.
//!
//! They need root (to load eBPF programs). Without it they fail loudly:
//! a skipped kernel test would hide exactly what CI is for.
//!
//! The test binaries import each helper from the module named for what it
//! supports.

pub mod assert;
pub mod cgroup;
pub mod gpu;
pub mod http;
pub mod kernel;
pub mod procs;
pub mod scratch;
pub mod stall;
pub mod torch;
pub mod workload;

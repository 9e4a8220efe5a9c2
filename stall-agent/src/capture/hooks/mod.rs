//! Each hook family's load, attach, fallback ladder and maps, by the names
//! the kernel side (stall-ebpf's `<family>/`) and stall-common's
//! `<family>.rs` use: the scheduler (`sched`), the syscalls (`syscalls`),
//! the page cache and mappings (`pagecache`), io_uring (`uring`) and the
//! GPU library probes (`gpu`).
pub mod gpu;
pub mod pagecache;
pub mod sched;
pub mod syscalls;
pub mod uring;

//! Types shared by stall's kernel side (`stall-ebpf`) and its agent.
//!
//! Everything here is `#[repr(C)]`, `Copy`, and free of implicit padding, so
//! the same bytes mean the same thing on both sides of a BPF map or the ring
//! buffer, and the verifier never sees uninitialised stack bytes.
//!
//! One module per domain; every item is re-exported here, where both sides
//! name it (`stall_common::ThreadStats`). [`names`] holds the names the
//! agent finds the object's maps, programs and globals by.
#![no_std]

mod config;
mod events;
mod files;
mod gpu;
pub mod kfunc;
pub mod names;
mod pagecache;
mod sched;
mod syscalls;
mod uring;

pub use config::{counter, track_gen, Config, LATENCY_RUN_EVENTS};
pub use events::{
    event_kind, CloseEvent, EventHeader, ExecEvent, ExitEvent, NewTaskEvent, OpenEvent, SwitchEvent,
};
pub use files::{fd_kind, inflight, FdKey, FileStats, FileWindows, InodeBytes, InodeKey, FILE_WINDOW_SLOTS};
pub use gpu::{
    fnv_words, gpu_call, gpu_symbols, CommInit, CommKey, Communicator, GpuCalls, COLLECTIVE_RING,
    NCCL_UNIQUE_ID_WORDS,
};
pub use pagecache::PageCacheOffsets;
pub use sched::{
    kclock, reason, run_state, sleep, slot_state, store_apart, task_flags, zeroed_in, CpuSlot, Plain, Regs,
    SwitchReads, TaskOffsets, ThreadStats, WakeCache, WakeKey, WakeStats, WAIT_NOTED, WAKER_ANY_THREAD,
    WAKER_SIGNAL, WAKE_CACHE_SLOTS, WOKEN_UNTIMED,
};
pub use syscalls::{hook, syscall_class, SyscallTables};
pub use uring::{uring_op, UringKey, UringLayout, UringRead, UringReads};

pub const COMM_LEN: usize = 16;
pub const PATH_LEN: usize = 256;

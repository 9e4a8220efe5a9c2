//! The kernel side's rare diagnostics (stall-ebpf's diag.rs, through
//! aya-log): a map full, a switch repaired from the kernel's counters. They
//! are the agent's debug log: `STALL_LOG=debug` prints them on stderr as
//! they are drained with the ring buffer's records. Otherwise the kernel
//! side is loaded with its log level at 0 and writes none.
use aya::{Ebpf, EbpfLoader};
use aya_log::EbpfLogger;

/// `STALL_LOG=debug` asks for the agent's debug log.
const LOG_ENV: &str = "STALL_LOG";

/// The kernel side's level global (aya-log-ebpf's).
const LEVEL_GLOBAL: &str = "AYA_LOG_LEVEL";

/// aya-log's value for debug records and those more severe.
const LEVEL_DEBUG: u8 = 4;

/// Whether the debug log is asked for.
fn wanted() -> bool {
    std::env::var_os(LOG_ENV).is_some_and(|v| v == "debug")
}

/// The level the kernel side is loaded with: debug where asked, else none.
pub(super) fn set_level(loader: &mut EbpfLoader<'_>) {
    let level: &'static u8 = if wanted() { &LEVEL_DEBUG } else { &0 };
    loader.override_global(LEVEL_GLOBAL, level, false);
}

/// The reader of the kernel side's records, where the log is asked for.
pub(super) fn reader(ebpf: &mut Ebpf) -> Option<EbpfLogger<KernelLog>> {
    if !wanted() {
        return None;
    }
    match EbpfLogger::init_with_logger(ebpf, KernelLog) {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!("stall: debug: no kernel log: {e}");
            None
        }
    }
}

/// Writes each record on stderr, one line, marked as the kernel's.
pub struct KernelLog;

impl log::Log for KernelLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Debug
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            eprintln!("stall: debug: kernel: {}", record.args());
        }
    }

    fn flush(&self) {}
}

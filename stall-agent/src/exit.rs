//! stall's exit codes, as `--help` lists them (cli.rs) and errors map to them (error.rs).
pub const INTERNAL: i32 = 1;
pub const USAGE: i32 = 2;
pub const NOT_PRIVILEGED: i32 = 3;
pub const NO_TARGET: i32 = 4;
pub const KERNEL: i32 = 5;
pub const GPU: i32 = 6;
pub const LISTEN: i32 = 7;
pub const NOT_EXECUTABLE: i32 = 126;
pub const NOT_FOUND: i32 = 127;

//! tracefs: which tracepoints this kernel has (checked at start-up, so a
//! missing one is named), and the layouts of their `format` files (field
//! offsets move between kernels, e.g. `sched_process_fork` on 6.1 vs 6.18).
//! The programs themselves are raw tracepoints and read no tracepoint
//! record: the task fields they read come from BTF (btf.rs).
use std::{
    fs,
    path::{Path, PathBuf},
};

use super::CaptureError;

const CANDIDATES: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The tracefs root, mounting it at /sys/kernel/tracing if nothing is there
/// (minimal systems and VMs often leave it unmounted).
pub fn root() -> Result<PathBuf, CaptureError> {
    if let Some(found) = CANDIDATES.iter().map(PathBuf::from).find(|p| p.join("events").is_dir()) {
        return Ok(found);
    }
    let target = PathBuf::from(CANDIDATES[0]);
    let mounted = nix::mount::mount(
        Some("tracefs"),
        &target,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
    match mounted {
        Ok(()) if target.join("events").is_dir() => Ok(target),
        _ => Err(CaptureError::NoTracefs),
    }
}

/// One field of a tracepoint's format: offset and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub offset: u16,
    pub size: u16,
}

/// Parses a `format` file's text and finds `name`.
pub fn parse_field(format: &str, name: &str) -> Option<Field> {
    format.lines().find_map(|line| {
        let line = line.trim();
        let decl = line.strip_prefix("field:")?.split(';').next()?;
        // "unsigned int fd" / "char prev_comm[16]" / "__data_loc char[] filename"
        let ident = decl.split_whitespace().last()?.trim_start_matches('*');
        let ident = ident.split('[').next()?;
        if ident != name {
            return None;
        }
        let num = |key: &str| -> Option<u16> {
            line.split(';').find_map(|part| part.trim().strip_prefix(key)?.trim().parse().ok())
        };
        Some(Field { offset: num("offset:")?, size: num("size:")? })
    })
}

pub struct Tracefs {
    root: PathBuf,
}

impl Tracefs {
    pub fn open() -> Result<Self, CaptureError> {
        Ok(Self { root: root()? })
    }

    pub fn has(&self, category: &str, event: &str) -> bool {
        self.root.join("events").join(category).join(event).join("format").exists()
    }

    /// A field of a tracepoint's record, if both exist.
    pub fn field(&self, category: &str, event: &str, name: &str) -> Option<Field> {
        parse_field(&fs::read_to_string(self.format_path(category, event)).ok()?, name)
    }

    fn format_path(&self, category: &str, event: &str) -> PathBuf {
        self.root.join("events").join(category).join(event).join("format")
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCH_6_18: &str = "name: sched_switch
ID: 327
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:char prev_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t prev_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:long prev_state;\toffset:32;\tsize:8;\tsigned:1;
\tfield:pid_t next_pid;\toffset:56;\tsize:4;\tsigned:1;
";
    const FORK_6_18: &str = "format:
\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;
";
    const FORK_6_1: &str = "format:
\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:0;
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:0;
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;
";

    #[test]
    fn finds_fields_and_sizes() {
        assert_eq!(parse_field(SWITCH_6_18, "prev_state"), Some(Field { offset: 32, size: 8 }));
        assert_eq!(parse_field(SWITCH_6_18, "next_pid"), Some(Field { offset: 56, size: 4 }));
        assert_eq!(parse_field(SWITCH_6_18, "prev_comm"), Some(Field { offset: 8, size: 16 }));
        assert_eq!(parse_field(SWITCH_6_18, "nope"), None);
    }

    #[test]
    fn layouts_differ_between_kernels() {
        assert_eq!(parse_field(FORK_6_18, "child_pid").unwrap().offset, 20);
        assert_eq!(parse_field(FORK_6_1, "child_pid").unwrap().offset, 44);
        assert_eq!(parse_field(FORK_6_18, "child_comm").unwrap().offset, 16);
    }

    #[test]
    fn pointer_fields() {
        let f = "\tfield:const char * filename;\toffset:24;\tsize:8;\tsigned:0;";
        assert_eq!(parse_field(f, "filename"), Some(Field { offset: 24, size: 8 }));
    }
}

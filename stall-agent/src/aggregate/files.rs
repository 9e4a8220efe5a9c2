//! Which files are the job's data: the classifiers that set code (the
//! interpreter's, its libraries', the system's) and the kernel's made-up
//! files apart, and what a share read from storage says of the page cache.

/// A file the kernel makes up as it is read (/proc, /sys, /dev): no page
/// cache, no storage, and no progress when written.
pub fn is_kernel_file(path: &str) -> bool {
    ["/sys/", "/proc/", "/dev/"].iter().any(|p| path.starts_with(p))
}

/// Files that are the interpreter's and its libraries' own (modules,
/// bytecode, shared objects, package metadata, the loader's cache) or the
/// system's configuration (/etc, /usr/share: locales, certificates, time
/// zones), which every interpreter reads as it starts, not the job's data:
/// the evidence names data files.
pub fn is_code_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    [".py", ".pyc", ".pyi", ".pth", ".so"].iter().any(|ext| name.ends_with(ext))
        || name.contains(".so.")
        || ["/__pycache__/", "/site-packages/", "/dist-packages/", "/lib/python3", "/lib64/python3"]
            .iter()
            .any(|d| path.contains(d))
        || [".dist-info/", ".egg-info/"].iter().any(|d| path.contains(d))
        || ["/etc/", "/usr/share/"].iter().any(|d| path.starts_with(d))
        // Executables (the interpreter a forked worker runs through the
        // parent's mapping) and the C library's locale data.
        || ["/bin/", "/sbin/"].iter().any(|d| path.contains(d))
        // The system's libraries and their data (the C library's charset
        // tables in gconv/, locales): no job keeps its data there.
        || ["/usr/lib/", "/usr/lib64/", "/lib/", "/lib64/"].iter().any(|d| path.starts_with(d))
        || path == "/etc/ld.so.cache"
        // A version manager's own scripts and settings (pyenv's shim runs
        // `libexec/pyenv*` through bash, reads its `version` files).
        || path.contains("/libexec/")
        || path.contains("/.pyenv/")
        || name == ".python-version"
        || is_stalls_own(path)
}

/// A file the job may have read as its data: neither code nor the
/// system's files ([`is_code_file`]) nor the kernel's (/proc, /sys, /dev).
pub fn is_data_file(path: &str) -> bool {
    !is_code_file(path) && !is_kernel_file(path)
}

/// stall's own executable: `stall run`'s gate maps it, in the command's
/// process, before it execs the command.
fn is_stalls_own(path: &str) -> bool {
    static OWN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    OWN.get_or_init(|| Some(std::env::current_exe().ok()?.to_string_lossy().into_owned()))
        .as_deref()
        .is_some_and(|own| own == path)
}

/// The part of `bytes` that came from storage (`storage` of them), at most 1.
pub fn storage_share(storage: u64, bytes: u64) -> f64 {
    (storage as f64 / bytes as f64).min(1.0)
}

/// What a share read from storage says of the page cache, where it says
/// something: it served nearly all (warm) or nearly none (cold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageCache {
    Warm,
    Cold,
}

impl PageCache {
    pub fn of(storage_share: f64) -> Option<Self> {
        match storage_share {
            s if s < 0.02 => Some(Self::Warm),
            s if s > 0.98 => Some(Self::Cold),
            _ => None,
        }
    }
}

/// A sum of byte counts that some windows may not have, as where the
/// kernel does not say what storage or mappings brought in (None + None
/// is None).
pub(super) fn add_known(mut a: Option<u64>, b: Option<u64>) -> Option<u64> {
    crate::decode::Counter::add(&mut a, &b);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_files_are_not_data() {
        for code in [
            "/usr/bin/python3.11",
            "/root/.pyenv/versions/3.11.7/bin/python3.11",
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so",
            "/usr/lib/locale/C.utf8/LC_CTYPE",
            "/etc/ld.so.cache",
            "/etc/ssl/certs/ca-certificates.crt",
            "/usr/share/locale/locale.alias",
            "/opt/venv/torch-2.15.0.dist-info/entry_points.txt",
            // What pyenv's shim reads before the interpreter starts.
            "/root/.pyenv/libexec/pyenv",
            "/root/.pyenv/libexec/pyenv-which",
            "/root/.pyenv/version",
            "/home/ml/project/.python-version",
            "/usr/libexec/git-core/git",
            "/usr/lib/x86_64-linux-gnu/gconv/gconv-modules.cache",
        ] {
            assert!(is_code_file(code), "{code}");
        }
        for data in
            ["/data/train/data-00000-of-00001.arrow", "/var/tmp/cache/rows_00000-02000.bin", "/ckpt/ckpt.pt"]
        {
            assert!(!is_code_file(data) && is_data_file(data), "{data}");
        }
        for kernel in ["/proc/self/maps", "/sys/fs/cgroup/cpu.max", "/dev/shm/torch_1234"] {
            assert!(!is_data_file(kernel), "{kernel}");
        }
    }
}

//! The guest's root file system, an initramfs written without root (cpio
//! `newc`, no device nodes: the kernel's built-in initramfs brings
//! /dev/console and /init mounts devtmpfs).
//!
//! It holds a userland copied from the host rather than built: busybox
//! (static) for /init's shell and tools, the host's Python with a pruned
//! standard library for the workloads, setpriv, stall and the test binaries
//! (debug info stripped), the scripted NVML library next to stall, every
//! shared library those need at its host path,
//! the tests' workload files at their host paths, since the test binaries
//! find them through `env!("CARGO_MANIFEST_DIR")`, and each kernel's RAM
//! disk module: one initramfs serves every kernel.

use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use super::kernel::Kernel;
use super::shard;
use super::{create_parent, require_file, TestBin};
use crate::cmd;

const INIT: &str = include_str!("init.sh");
/// What /init runs instead of the tests for `cargo xtask bench --vm`.
const BENCH_HOOKS: &str = include_str!("bench-hooks.sh");
const GUEST_BENCH_HOOKS: &str = "stall/bench-hooks.sh";
const BUSYBOX: &str = "/bin/busybox";
const PYTHON: &str = "/usr/bin/python3";
/// Host programs the tests run besides stall and Python, and their Debian
/// packages: errors.rs drops privileges with setpriv (busybox has none),
/// privilege.rs runs stall as `nobody` with exact capabilities through
/// capsh, faults.rs asks bpftool what is still loaded, daemon.rs scrapes
/// stall with a real Prometheus and checks with promtool, web.rs talks
/// HTTPS to it with curl and a CA made with openssl, chains.rs starts
/// jobs through bash, GNU timeout and make as users do (`cargo xtask test`
/// installs them).
const HOST_TOOLS: [(&str, &str); 10] = [
    ("/usr/bin/setpriv", "util-linux"),
    ("/usr/sbin/capsh", "libcap2-bin"),
    ("/usr/sbin/bpftool", "bpftool"),
    ("/usr/bin/prometheus", "prometheus"),
    ("/usr/bin/promtool", "prometheus"),
    ("/usr/bin/curl", "curl"),
    ("/usr/bin/openssl", "openssl"),
    ("/usr/bin/bash", "bash"),
    ("/usr/bin/timeout", "coreutils"),
    ("/usr/bin/make", "make"),
];
/// Workspace folders the tests read at run time (workloads, demo job, the
/// alerting rules).
const WORKSPACE_DATA: [&str; 3] = ["tests", "demo", "deploy"];
/// Where stall, the test binaries and /init's settings go in the guest.
const GUEST_STALL: &str = "stall/bin/stall";
/// The scripted NVML library the GPU tests load (`STALL_NVML_SCRIPT_LIB`).
const GUEST_NVML_SCRIPT: &str = "stall/bin/libstall_nvml_script.so";
/// The stand-in CUDA library the CUDA tests' jobs load (`STALL_CUDA_STUB_LIB`).
const GUEST_CUDA_STUB: &str = "stall/bin/libstall_cuda_stub.so";
/// The stand-in NCCL library the NCCL tests' jobs load (`STALL_NCCL_STUB_LIB`).
const GUEST_NCCL_STUB: &str = "stall/bin/libstall_nccl_stub.so";
const GUEST_TESTS: &str = "stall/tests";
const GUEST_ENV: &str = "stall/env.sh";
const GUEST_SKIP: &str = "stall/skip";
/// The guest's user database: root, and the `nobody` the privilege tests
/// run stall as.
const ETC_FILES: [(&str, &str); 3] = [
    ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"),
    ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
    ("etc/nsswitch.conf", "passwd: files\ngroup: files\n"),
];
/// Standard library folders no workload imports: left out to keep the
/// initramfs small (the `config-*` folder alone is 25 MB of static library).
const PY_SKIP_DIRS: [&str; 10] = [
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "distutils",
    "site-packages",
    "dist-packages",
];
/// Extension modules no workload needs, by name prefix: tests, terminals,
/// databases, audio and TLS (which would bring libssl and libcrypto).
const PY_SKIP_MODULES: [&str; 12] = [
    "_test",
    "_ctypes_test",
    "_xxtestfuzz",
    "xxlimited",
    "_curses",
    "readline",
    "_sqlite3",
    "_dbm",
    "nis",
    "ossaudiodev",
    "_ssl",
    "_hashlib",
];

/// The stand-ins for NVIDIA's libraries that the GPU tests load.
pub struct GpuLibs<'a> {
    /// libstall_nvml_script.so, for stall (`STALL_NVML_SCRIPT_LIB`).
    pub nvml_script: &'a Path,
    /// libstall_cuda_stub.so, for the jobs (`STALL_CUDA_STUB_LIB`).
    pub cuda_stub: &'a Path,
    /// libstall_nccl_stub.so, for the jobs (`STALL_NCCL_STUB_LIB`).
    pub nccl_stub: &'a Path,
}

/// Writes target/vm/initramfs.cpio from a staging tree in target/vm/root
/// and returns its path. `skip` lists the tests /init leaves out, as
/// (binary, test name); `extra` more programs, as (host path, guest path).
pub fn build(
    vm_dir: &Path,
    stall: &Path,
    gpu: &GpuLibs,
    tests: &[TestBin],
    skip: &[(&str, &str)],
    kernels: &[Kernel],
    extra: &[(&Path, &str)],
) -> Result<PathBuf> {
    let start = Instant::now();
    let stage = Stage::fresh(vm_dir.join("root"))?;
    stage.busybox()?;
    let mut elves = stage.stall_and_tests(stall, tests, skip)?;
    elves.push(stage.program(gpu.nvml_script, GUEST_NVML_SCRIPT, true)?);
    elves.push(stage.program(gpu.cuda_stub, GUEST_CUDA_STUB, true)?);
    elves.push(stage.program(gpu.nccl_stub, GUEST_NCCL_STUB, true)?);
    for (host, guest) in extra {
        elves.push(stage.program(host, guest, true)?);
    }
    for (tool, package) in HOST_TOOLS {
        require_file(Path::new(tool), package)?;
        elves.push(stage.program(Path::new(tool), tool, false)?);
    }
    elves.extend(stage.python()?);
    stage.libraries(&elves)?;
    let not_cache = |p: &Path| !p.ends_with("__pycache__") && !p.ends_with("target");
    for dir in WORKSPACE_DATA {
        let host = cmd::workspace_root().join(dir);
        stage.tree(&host, &host, &not_cache)?;
    }
    stage.ramdisk_modules(kernels)?;
    stage.write(GUEST_ENV, env_script(stall), false)?;
    // Users for capsh --user=nobody (privilege.rs); glibc reads them from files.
    for (file, text) in ETC_FILES {
        stage.write(file, text.to_string(), false)?;
    }
    stage.write("init", INIT.to_string(), true)?;
    stage.write(GUEST_BENCH_HOOKS, BENCH_HOOKS.to_string(), true)?;
    stage.write(shard::GUEST_SHARD_AWK, shard::SHARD_AWK.to_string(), false)?;
    stage.write(shard::GUEST_WEIGHTS, shard::weights(), false)?;
    let cpio = vm_dir.join("initramfs.cpio");
    write_cpio(&stage.root, &cpio)?;
    let size = fs::metadata(&cpio).with_context(|| format!("reading {}", cpio.display()))?.len();
    println!(
        "integration-test vm: {} ({:.0} MB) in {:.1}s",
        cpio.display(),
        size as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    Ok(cpio)
}

/// Settings for /init: stall's, the scripted NVML library's and the
/// stand-in CUDA library's guest paths and the folder cargo would run the
/// tests in (the tests crate's).
fn env_script(host_stall: &Path) -> String {
    let tests_dir = cmd::workspace_root().join("tests");
    format!(
        "# written by xtask/src/vm/initramfs.rs for {}\nexport STALL_BIN=/{GUEST_STALL}\n\
         export STALL_NVML_SCRIPT_LIB=/{GUEST_NVML_SCRIPT}\n\
         export STALL_CUDA_STUB_LIB=/{GUEST_CUDA_STUB}\n\
         export STALL_NCCL_STUB_LIB=/{GUEST_NCCL_STUB}\nSTALL_TEST_DIR={}\n",
        host_stall.display(),
        shell_quote(&tests_dir.to_string_lossy())
    )
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The staging tree: guest paths are host-like absolute paths under `root`.
struct Stage {
    root: PathBuf,
}

impl Stage {
    fn fresh(root: PathBuf) -> Result<Self> {
        if root.exists() {
            fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
        }
        for dir in ["proc", "sys", "dev", "tmp", "run", "root", "etc", "bin"] {
            let path = root.join(dir);
            fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        }
        Ok(Self { root })
    }

    /// `guest` (absolute or not) inside the stage.
    fn path(&self, guest: impl AsRef<Path>) -> PathBuf {
        self.root.join(guest.as_ref().strip_prefix("/").unwrap_or(guest.as_ref()))
    }

    /// /bin/busybox and a link per applet in /bin.
    fn busybox(&self) -> Result<()> {
        require_file(Path::new(BUSYBOX), "busybox-static")?;
        self.copy(Path::new(BUSYBOX), BUSYBOX)?;
        let out = cmd::output(cmd::command(BUSYBOX).arg("--list"))?;
        ensure!(out.status.success(), "`{BUSYBOX} --list` failed");
        for applet in String::from_utf8_lossy(&out.stdout).lines().filter(|a| *a != "busybox") {
            let link = self.path("bin").join(applet);
            symlink("busybox", &link).with_context(|| format!("linking {}", link.display()))?;
        }
        Ok(())
    }

    /// Copies an ELF program to `guest`, without debug info if `strip`;
    /// returns the host path, for [`Self::libraries`].
    fn program(&self, host: &Path, guest: &str, strip: bool) -> Result<PathBuf> {
        let dest = self.path(guest);
        create_parent(&dest)?;
        let stripped = strip
            && cmd::command("strip")
                .arg("--strip-debug")
                .arg("-o")
                .arg(&dest)
                .arg(host)
                .status()
                .is_ok_and(|s| s.success());
        if !stripped {
            self.copy(host, guest)?;
        }
        Ok(host.to_path_buf())
    }

    /// stall and the test binaries, and each binary's list of tests to skip;
    /// returns their host paths.
    fn stall_and_tests(
        &self,
        stall: &Path,
        tests: &[TestBin],
        skip: &[(&str, &str)],
    ) -> Result<Vec<PathBuf>> {
        let mut elves = vec![self.program(stall, GUEST_STALL, true)?];
        for t in tests {
            elves.push(self.program(&t.path, &format!("{GUEST_TESTS}/{}", t.name), true)?);
            let names: Vec<&str> =
                skip.iter().filter(|(bin, _)| *bin == t.name).map(|(_, test)| *test).collect();
            if !names.is_empty() {
                self.write(&format!("{GUEST_SKIP}/{}", t.name), names.join("\n") + "\n", false)?;
            }
        }
        Ok(elves)
    }

    /// Each kernel's brd module as /lib/modules/RELEASE/brd.ko[.xz].
    fn ramdisk_modules(&self, kernels: &[Kernel]) -> Result<()> {
        for k in kernels {
            if let Some(module) = &k.ramdisk_module {
                let file = module.file_name().context("a module file name")?;
                self.copy(module, Path::new("/lib/modules").join(&k.name).join(file))?;
            }
        }
        Ok(())
    }

    /// /usr/bin/python3, its interpreter and standard library; returns the
    /// ELF files among them.
    fn python(&self) -> Result<Vec<PathBuf>> {
        require_file(Path::new(PYTHON), "python3")?;
        let exe = fs::canonicalize(PYTHON).with_context(|| format!("resolving {PYTHON}"))?;
        let version = exe.file_name().context("python's file name")?.to_string_lossy().into_owned();
        let stdlib = Path::new("/usr/lib").join(&version);
        require_file(&stdlib, "libpython3-stdlib")?;
        self.copy(&exe, &exe)?;
        let link = self.path(PYTHON);
        if exe != Path::new(PYTHON) {
            symlink(&version, &link).with_context(|| format!("linking {}", link.display()))?;
        }
        let keep = |p: &Path| {
            let name = p.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
            let in_dynload = p.parent().is_some_and(|d| d.ends_with("lib-dynload"));
            !(PY_SKIP_DIRS.contains(&name.as_ref())
                || name.starts_with("config-")
                || name.contains(".opt-")
                || (in_dynload && PY_SKIP_MODULES.iter().any(|m| name.starts_with(m))))
        };
        let mut elves = vec![exe];
        let files = self.tree(&stdlib, &stdlib, &keep)?;
        elves.extend(files.into_iter().filter(|p| p.extension().is_some_and(|e| e == "so")));
        Ok(elves)
    }

    /// Every shared library `elves` load (as `ldd` resolves them on the host),
    /// the dynamic loader included, at its host path.
    fn libraries(&self, elves: &[PathBuf]) -> Result<()> {
        let mut libs: Vec<PathBuf> = Vec::new();
        for elf in elves {
            for lib in ldd(elf)? {
                if !libs.contains(&lib) {
                    libs.push(lib);
                }
            }
        }
        for lib in &libs {
            self.copy(lib, lib)?;
        }
        Ok(())
    }

    /// Copies the host tree `host` to `guest`, following symlinks (dangling
    /// ones are left out), only what `keep` accepts; returns the files copied.
    fn tree(&self, host: &Path, guest: &Path, keep: &dyn Fn(&Path) -> bool) -> Result<Vec<PathBuf>> {
        let mut copied = Vec::new();
        let mut entries: Vec<PathBuf> = fs::read_dir(host)
            .with_context(|| format!("reading {}", host.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for path in entries {
            if !keep(&path) {
                continue;
            }
            let name = path.file_name().unwrap_or_default();
            let Ok(meta) = fs::metadata(&path) else { continue };
            let dest = guest.join(name);
            if meta.is_dir() {
                copied.extend(self.tree(&path, &dest, keep)?);
            } else {
                self.copy(&path, &dest)?;
                copied.push(path);
            }
        }
        Ok(copied)
    }

    /// Copies a host file's contents (symlinks followed) and modification
    /// time to `guest`: Python trusts its cached bytecode only while the
    /// source's mtime matches (cpio and the kernel keep mtimes).
    fn copy(&self, host: &Path, guest: impl AsRef<Path>) -> Result<()> {
        let dest = self.path(guest);
        create_parent(&dest)?;
        let what = || format!("copying {} to {}", host.display(), dest.display());
        fs::copy(host, &dest).with_context(what)?;
        let mtime = fs::metadata(host).and_then(|m| m.modified()).with_context(what)?;
        fs::File::open(&dest).and_then(|f| f.set_modified(mtime)).with_context(what)
    }

    fn write(&self, guest: &str, text: String, executable: bool) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let dest = self.path(guest);
        create_parent(&dest)?;
        fs::write(&dest, text).with_context(|| format!("writing {}", dest.display()))?;
        let mode = if executable { 0o755 } else { 0o644 };
        fs::set_permissions(&dest, fs::Permissions::from_mode(mode))
            .with_context(|| format!("chmod {}", dest.display()))
    }
}

/// The libraries `ldd` resolves for `elf`; none for a static binary.
fn ldd(elf: &Path) -> Result<Vec<PathBuf>> {
    let out = cmd::output(cmd::command("ldd").arg(elf))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        ensure!(
            text.contains("not a dynamic executable")
                || String::from_utf8_lossy(&out.stderr).contains("not a dynamic"),
            "ldd {} failed: {}",
            elf.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        return Ok(Vec::new());
    }
    parse_ldd(&text).with_context(|| format!("libraries of {}", elf.display()))
}

fn parse_ldd(text: &str) -> Result<Vec<PathBuf>> {
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", "/lib64/ld-linux-x86-64.so.2 (0x...)"
        let resolved = match line.split_once("=>") {
            Some((name, rest)) if rest.trim().starts_with("not found") => bail!("{} not found", name.trim()),
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(path) = resolved.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// `cpio -o -H newc` over the staging tree, entries owned by root (the
/// files belong to whoever built them), parents before children.
fn write_cpio(root: &Path, out: &Path) -> Result<()> {
    let mut names = Vec::new();
    list(root, Path::new(""), &mut names)?;
    let file = fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
    let mut cpio = cmd::command("cpio");
    cpio.args(["-o", "-H", "newc", "--null", "--quiet", "-R", "0:0"])
        .current_dir(root)
        .stdin(Stdio::piped())
        .stdout(file);
    let mut child = cpio.spawn().context("could not start cpio")?;
    let mut stdin = child.stdin.take().context("cpio's stdin")?;
    for name in &names {
        stdin.write_all(name.as_os_str().as_encoded_bytes()).and_then(|()| stdin.write_all(b"\0"))?;
    }
    drop(stdin);
    let status = child.wait().context("waiting for cpio")?;
    ensure!(status.success(), "cpio failed ({status}) writing {}", out.display());
    Ok(())
}

/// Relative paths under `root/rel`, pre-order, symlinks not followed.
fn list(root: &Path, rel: &Path, names: &mut Vec<PathBuf>) -> Result<()> {
    let dir = root.join(rel);
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for name in entries {
        let path = rel.join(&name);
        names.push(path.clone());
        if fs::symlink_metadata(root.join(&path))?.is_dir() {
            list(root, &path, names)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_ldd_output() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f2b)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f2b)\n";
        let libs = parse_ldd(text).unwrap();
        assert_eq!(
            libs,
            [Path::new("/lib/x86_64-linux-gnu/libgcc_s.so.1"), Path::new("/lib64/ld-linux-x86-64.so.2")]
        );
        assert!(parse_ldd("\tlibfoo.so.1 => not found\n").is_err());
    }

    #[test]
    fn quotes_for_the_shell() {
        assert_eq!(shell_quote("/w/it's"), r"'/w/it'\''s'");
    }
}

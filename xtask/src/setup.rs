//! `cargo xtask setup`: make sure the toolchain that builds stall's eBPF
//! programs is installed, installing what is missing.
//!
//! stall-ebpf is compiled by Debian's rustc-web (which ships a std for
//! bpfel-unknown-none) and linked by bpf-linker built against the same LLVM
//! major (22). Everything is checked before anything is installed, so the
//! common case (nothing missing) takes a fraction of a second.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use crate::cmd;

/// Debian packages providing rustc for BPF targets, LLVM 22 for bpf-linker,
/// and protoc, which compiles the container runtime's CRI API (k8s-cri).
const PACKAGES: [&str; 5] =
    ["rustc-web", "cargo-web", "libstd-rust-web-dev-bpf", "llvm-22-dev", "protobuf-compiler"];
/// The workspace's rust-version. bookworm main only has rustc-web 1.85; the
/// newer one comes from bookworm-security.
const MIN_RUSTC_WEB: (u32, u32) = (1, 95);
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const BPF_STD: &str = "/usr/lib/rustlib/bpfel-unknown-none";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const BPF_LINKER_SERIES: &str = "0.13.";
/// `--force`: replace a bpf-linker of another version, even one that cargo
/// did not install (setup only installs when the one found is wrong).
const BPF_LINKER_INSTALL_ARGS: [&str; 9] = [
    "install",
    "--force",
    "bpf-linker",
    "--version",
    "^0.13",
    "--locked",
    "--no-default-features",
    "--features",
    "llvm-22",
];
const TRACEFS: &str = "/sys/kernel/tracing";

/// The first bpf-linker on the children's PATH and what it reports.
enum Linker {
    Missing,
    Wrong { path: PathBuf, version: String },
    Ok { version: String },
}

/// What has to be installed.
struct Missing {
    packages: Vec<&'static str>,
    linker: Option<String>,
}

impl Missing {
    fn is_empty(&self) -> bool {
        self.packages.is_empty() && self.linker.is_none()
    }

    /// What is missing and the commands that install it, for error messages.
    fn explain(&self) -> String {
        let mut text = String::from("BPF toolchain incomplete, missing:\n");
        if !self.packages.is_empty() {
            let _ = writeln!(text, "  Debian packages: {}", self.packages.join(" "));
        }
        if let Some(why) = &self.linker {
            let _ = writeln!(text, "  bpf-linker 0.13 built against LLVM 22 ({why})");
        }
        text.push_str("to install it, run `cargo xtask setup` as root, or by hand:\n");
        if !self.packages.is_empty() {
            text.push_str("  apt-get update  # with bookworm-security in the apt sources\n");
            let _ = writeln!(
                text,
                "  DEBIAN_FRONTEND=noninteractive apt-get install -y {}",
                self.packages.join(" ")
            );
        }
        if self.linker.is_some() {
            let _ = writeln!(text, "  LLVM_PREFIX={LLVM_PREFIX} cargo {}", BPF_LINKER_INSTALL_ARGS.join(" "));
        }
        text
    }
}

/// Installs whatever is missing; run first by every subcommand that builds.
pub fn ensure() -> Result<()> {
    let start = Instant::now();
    let missing = find_missing()?;
    let installed = !missing.is_empty();
    if installed {
        install(&missing)?;
    }
    let summary = verify()?;
    ensure_tracefs();
    let state = if installed { "installed" } else { "present" };
    println!("setup: BPF toolchain {state} ({summary}) in {:.2}s", start.elapsed().as_secs_f64());
    Ok(())
}

fn find_missing() -> Result<Missing> {
    let versions = installed_packages()?;
    let packages = PACKAGES
        .into_iter()
        .filter(|pkg| match versions.get(*pkg) {
            None => true,
            // Too old counts as missing: apt-get install upgrades it.
            Some(v) => *pkg == "rustc-web" && major_minor(v) < MIN_RUSTC_WEB,
        })
        .collect();
    let linker = match bpf_linker() {
        Linker::Ok { .. } => None,
        Linker::Missing => Some("not found".to_string()),
        Linker::Wrong { path, version } => Some(format!("found bpf-linker {version} at {}", path.display())),
    };
    Ok(Missing { packages, linker })
}

fn install(missing: &Missing) -> Result<()> {
    if !missing.packages.is_empty() {
        if let Err(why) = can_use_apt() {
            bail!("cannot install the BPF toolchain: {why}\n{}", missing.explain());
        }
        apt_install(&missing.packages).with_context(|| missing.explain())?;
    }
    if missing.linker.is_some() {
        install_bpf_linker().with_context(|| missing.explain())?;
    }
    Ok(())
}

/// Checks what the build relies on, whether just installed or already there,
/// and returns a summary of the versions.
fn verify() -> Result<String> {
    let versions = installed_packages()?;
    for pkg in PACKAGES {
        ensure!(versions.contains_key(pkg), "Debian package {pkg} is not installed");
    }
    for path in [DEBIAN_RUSTC, BPF_STD] {
        ensure!(
            Path::new(path).exists(),
            "{path} is missing although {} are installed; reinstall them",
            PACKAGES.join(" ")
        );
    }
    let (major, minor) = major_minor(&versions["rustc-web"]);
    ensure!(
        (major, minor) >= MIN_RUSTC_WEB,
        "rustc-web {major}.{minor} is too old (need {}.{}+); enable bookworm-security in the \
         apt sources and run `apt-get update && apt-get install -y rustc-web`",
        MIN_RUSTC_WEB.0,
        MIN_RUSTC_WEB.1
    );
    let linker = match bpf_linker() {
        Linker::Ok { version } => version,
        Linker::Missing => bail!("bpf-linker is still not on PATH after installing it"),
        Linker::Wrong { path, version } => bail!(
            "{} is bpf-linker {version}, not 0.13; remove it or put {} first on PATH",
            path.display(),
            cmd::cargo_bin_dir().unwrap_or_default().display()
        ),
    };
    Ok(format!("rustc-web {major}.{minor}, bpf-linker {linker}"))
}

/// Versions of the installed packages among [`PACKAGES`], from one dpkg-query
/// call. No dpkg at all means nothing is installed.
fn installed_packages() -> Result<HashMap<String, String>> {
    installed(&PACKAGES)
}

/// Debian packages the integration tests use besides the toolchain: a real
/// Prometheus server (and promtool) for the daemon's test, capsh to run
/// stall as `nobody` with exact capabilities (privilege.rs), bpftool to
/// list what stall leaves loaded (faults.rs), pip for PyTorch, curl and
/// openssl for the daemon's HTTPS (web.rs: a real client, a test CA),
/// containerd (with runc and ctr) and a static busybox for the pods of
/// kube.rs.
const TEST_PACKAGES: [&str; 9] = [
    "prometheus",
    "libcap2-bin",
    "bpftool",
    "python3-pip",
    "curl",
    "openssl",
    "containerd",
    "busybox-static",
    "make",
];

/// PyTorch for the distributed-run tests (torchrun, gloo on CPU), from
/// PyPI with its CUDA wheels (about 5 GB, about a minute here): installed
/// once per machine into this directory, for the system Python the tests
/// run (`PYTHONPATH`), and kept.
const TORCH_DIR: &str = "/var/cache/stall-tests/torch-2.15.0";
const TORCH_PACKAGES: [&str; 2] = ["torch==2.15.0", "numpy"];

/// Hugging Face `datasets` (with pyarrow, pandas and the numpy PyTorch
/// uses) for the tests of a table mapped before the DataLoader forks and of
/// one handed to a DataLoader; about 400 MB, 15 s here. On `PYTHONPATH`
/// beside [`TORCH_DIR`].
const DATASETS_DIR: &str = "/var/cache/stall-tests/datasets-5.2.0";
const DATASETS_PACKAGES: [&str; 1] = ["datasets==5.2.0"];

/// What tests/tests/manifests.rs validates deploy/ against, offline and
/// strictly (tests/manifests/validate.py): kubernetes-validate bundles
/// Kubernetes' own JSON schemas (1.25 to 1.37, each with a `-strict` variant
/// that rejects unknown fields); cloudcoil-models-prometheus-operator holds
/// the Prometheus Operator's CRDs (ServiceMonitor, PrometheusRule) of
/// operator 0.80.1 as Pydantic models generated from their openAPIV3Schema
/// (its newer releases need Python 3.14; Debian 12 has 3.11). About 140 MB,
/// 10 s here; on `PYTHONPATH` for the system Python, like [`TORCH_DIR`].
/// Pinned, with the validators they run on (jsonschema, pydantic), so that
/// no release changes what passes.
const SCHEMAS_DIR: &str = "/var/cache/stall-tests/schemas-k8s-1.37.0-prometheus-operator-0.80.1.0";
const SCHEMA_PACKAGES: [&str; 5] = [
    "kubernetes-validate==1.37.0",
    "jsonschema==4.26.0",
    "cloudcoil-models-prometheus-operator==0.80.1.0",
    "cloudcoil==0.6.0",
    "pydantic==2.14.4",
];

/// The directory holding the manifests' schemas, installed if missing.
pub fn ensure_schemas() -> Result<PathBuf> {
    pip_install(
        SCHEMAS_DIR,
        "kubernetes_validate",
        &SCHEMA_PACKAGES,
        "Kubernetes and Prometheus Operator schemas",
    )
}

/// The directory holding PyTorch for the tests, installed if missing.
pub fn ensure_torch() -> Result<PathBuf> {
    pip_install(TORCH_DIR, "torch", &TORCH_PACKAGES, "PyTorch")
}

/// The directory holding Hugging Face `datasets`, installed if missing.
pub fn ensure_datasets() -> Result<PathBuf> {
    pip_install(DATASETS_DIR, "datasets", &DATASETS_PACKAGES, "Hugging Face datasets")
}

/// `packages` from PyPI into `dir` (unless it holds `module` already),
/// for the system Python, through a partial directory so that an
/// interrupted install is never taken for one.
fn pip_install(dir: &str, module: &str, packages: &[&str], what: &str) -> Result<PathBuf> {
    let dir = PathBuf::from(dir);
    if dir.join(module).join("__init__.py").exists() {
        return Ok(dir);
    }
    let partial = dir.with_extension("partial");
    let _ = fs::remove_dir_all(&partial);
    let started = Instant::now();
    let mut pip = cmd::command("/usr/bin/python3");
    pip.args(["-m", "pip", "install", "--quiet", "--no-cache-dir", "--target"]).arg(&partial).args(packages);
    cmd::run(&mut pip).with_context(|| format!("installing {what} for the tests"))?;
    fs::rename(&partial, &dir).with_context(|| format!("moving {what} into {}", dir.display()))?;
    println!("xtask: {what} installed in {} ({:.0}s)", dir.display(), started.elapsed().as_secs_f64());
    Ok(dir)
}

/// Installs [`TEST_PACKAGES`] if any is missing (quiet when all are there).
pub fn ensure_test_packages() -> Result<()> {
    let have = installed(&TEST_PACKAGES)?;
    let missing: Vec<&str> = TEST_PACKAGES.into_iter().filter(|p| !have.contains_key(*p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    can_use_apt().with_context(|| format!("the integration tests need {}", missing.join(" ")))?;
    apt_install(&missing)
}

fn installed(packages: &[&str]) -> Result<HashMap<String, String>> {
    let mut query = cmd::command("dpkg-query");
    query.args(["-W", "-f=${Package}\t${Status}\t${Version}\n"]);
    query.args(packages);
    let Ok(out) = cmd::output(&mut query) else {
        return Ok(HashMap::new());
    };
    // dpkg-query exits 1 when some package is unknown; the rest is still listed.
    let stdout = String::from_utf8(out.stdout).context("dpkg-query printed non-UTF-8")?;
    Ok(stdout
        .lines()
        .filter_map(|line| {
            let mut fields = line.split('\t');
            let (name, status, version) = (fields.next()?, fields.next()?, fields.next()?);
            (status == "install ok installed").then(|| (name.to_string(), version.to_string()))
        })
        .collect())
}

/// "1.96.0+dfsg1-1~deb12u2" -> (1, 96); unparsable versions sort lowest.
fn major_minor(version: &str) -> (u32, u32) {
    let mut parts = version.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (next(), next())
}

/// Finds the bpf-linker that child processes will run (first on their PATH).
fn bpf_linker() -> Linker {
    let Some(path) =
        std::env::split_paths(cmd::tool_path()).map(|dir| dir.join("bpf-linker")).find(|p| p.is_file())
    else {
        return Linker::Missing;
    };
    let version = cmd::output(cmd::command(&path).arg("--version"))
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.split_whitespace().nth(1).map(str::to_string)
        })
        .unwrap_or_else(|| "(unknown version)".to_string());
    if version.starts_with(BPF_LINKER_SERIES) {
        Linker::Ok { version }
    } else {
        Linker::Wrong { path, version }
    }
}

/// Why apt-get cannot be used here, if it cannot.
fn can_use_apt() -> Result<()> {
    let os_release = fs::read_to_string("/etc/os-release").unwrap_or_default();
    let id = os_release
        .lines()
        .find_map(|l| l.strip_prefix("ID="))
        .map(|v| v.trim_matches('"'))
        .unwrap_or("unknown");
    ensure!(id == "debian", "this is not Debian (ID={id}); the packages are Debian 12's");
    ensure!(
        std::env::split_paths(cmd::tool_path()).any(|d| d.join("apt-get").is_file()),
        "apt-get not found"
    );
    ensure!(cmd::is_root()?, "not running as root");
    Ok(())
}

fn apt_install(packages: &[&str]) -> Result<()> {
    println!("setup: installing Debian packages: {}", packages.join(" "));
    let apt = || {
        let mut c = cmd::command("apt-get");
        c.env("DEBIAN_FRONTEND", "noninteractive");
        c
    };
    cmd::run(apt().arg("update"))?;
    cmd::run(apt().args(["install", "-y"]).args(packages))
}

fn install_bpf_linker() -> Result<()> {
    ensure!(
        Path::new(LLVM_PREFIX).join("bin/llvm-config").exists(),
        "{LLVM_PREFIX}/bin/llvm-config not found (llvm-22-dev is needed to build bpf-linker)"
    );
    println!("setup: building bpf-linker 0.13 against LLVM 22 (takes a few minutes)");
    cmd::run(cmd::cargo().env("LLVM_PREFIX", LLVM_PREFIX).args(BPF_LINKER_INSTALL_ARGS))
        .context("building bpf-linker (needs llvm-22-dev and access to crates.io)")
}

/// stall reads tracepoint formats from tracefs; mount it if the kernel did not.
/// A failure here is only a warning: the toolchain itself is fine.
fn ensure_tracefs() {
    // Only NotFound means unmounted: non-root users get PermissionDenied.
    match fs::metadata(Path::new(TRACEFS).join("events")) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        _ => return,
    }
    println!("setup: mounting tracefs at {TRACEFS}");
    if let Err(e) = cmd::run(cmd::command("mount").args(["-t", "tracefs", "nodev", TRACEFS])) {
        eprintln!("setup: warning: could not mount tracefs: {e:#}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_debian_versions() {
        assert_eq!(major_minor("1.96.0+dfsg1-1~deb12u2"), (1, 96));
        assert_eq!(major_minor("1.85.0+dfsg3-1~deb12u3"), (1, 85));
        assert!(major_minor("garbage") < MIN_RUSTC_WEB);
    }

    #[test]
    fn explains_how_to_install() {
        let missing = Missing { packages: vec!["llvm-22-dev"], linker: Some("not found".into()) };
        let text = missing.explain();
        assert!(text.contains("apt-get install -y llvm-22-dev"));
        assert!(
            text.contains("LLVM_PREFIX=/usr/lib/llvm-22 cargo install --force bpf-linker --version ^0.13")
        );
    }
}

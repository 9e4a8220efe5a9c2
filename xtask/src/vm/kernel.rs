//! Kernels to boot: Debian bookworm cloud kernels fetched with `apt-get
//! download` and cached under target/vm/kernels (only their boot/ folder and
//! the RAM disk module are unpacked), or a vmlinuz given by path.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use crate::cmd;

/// Series booted when no `--kernel` is given.
pub const DEFAULT: [&str; 2] = ["6.1", "6.12"];

/// A kernel series and its package names, `{prefix}{number}{suffix}`: the
/// cloud flavour has BTF and BPF built in and boots quickly in QEMU.
struct Series {
    alias: &'static str,
    prefix: &'static str,
    suffix: &'static str,
}

const SERIES: [Series; 2] = [
    // bookworm's own kernel (main and bookworm-security)
    Series { alias: "6.1", prefix: "linux-image-6.1.0-", suffix: "-cloud-amd64-unsigned" },
    // the 6.12 LTS built for bookworm (bookworm-security)
    Series { alias: "6.12", prefix: "linux-image-6.12.", suffix: "+deb12-cloud-amd64-unsigned" },
];
const SEARCH: &str = "^linux-image-.*-cloud-amd64-unsigned$";
/// What is unpacked from a package: the image, and brd (the RAM disk
/// module, `.ko` or `.ko.xz`) for a block device in the guest.
const UNPACK: [&str; 2] = ["./boot/*", "./lib/modules/*/kernel/drivers/block/brd.ko*"];

/// A kernel image and the name its logs and table row go by (its release,
/// e.g. `6.1.0-57-cloud-amd64`).
pub struct Kernel {
    pub name: String,
    pub vmlinuz: PathBuf,
    /// brd.ko(.xz) of this very build, if known (not for a bare vmlinuz).
    pub ramdisk_module: Option<PathBuf>,
}

/// Resolves every `--kernel` spec, downloading what is not cached yet.
pub fn resolve_all(specs: &[String], cache: &Path) -> Result<Vec<Kernel>> {
    let mut kernels: Vec<Kernel> = Vec::new();
    for spec in specs {
        let kernel = resolve(spec, cache).with_context(|| format!("kernel `{spec}`"))?;
        if !kernels.iter().any(|k| k.name == kernel.name) {
            kernels.push(kernel);
        }
    }
    Ok(kernels)
}

fn resolve(spec: &str, cache: &Path) -> Result<Kernel> {
    if Path::new(spec).is_file() {
        let vmlinuz = fs::canonicalize(spec).with_context(|| format!("resolving {spec}"))?;
        let file = vmlinuz.file_name().context("a file name")?.to_string_lossy();
        let name = file.strip_prefix("vmlinuz-").unwrap_or(&file).to_string();
        return Ok(Kernel { name, vmlinuz, ramdisk_module: None });
    }
    let package = match SERIES.iter().find(|s| s.alias == spec) {
        Some(series) => newest(series)?,
        None if spec.starts_with("linux-image-") => spec.to_string(),
        None => bail!("not a file, a linux-image-* package, nor one of the series 6.1, 6.12"),
    };
    fetch(&package, cache)
}

/// The newest package of a series that apt knows of; updates apt's lists
/// once if it knows none (a fresh container).
fn newest(series: &Series) -> Result<String> {
    if let Some(found) = newest_known(series)? {
        return Ok(found);
    }
    ensure!(
        cmd::is_root()?,
        "apt knows no {}N{} package; run `apt-get update` as root",
        series.prefix,
        series.suffix
    );
    apt_update()?;
    newest_known(series)?
        .with_context(|| format!("no {}N{} package in the apt sources", series.prefix, series.suffix))
}

fn newest_known(series: &Series) -> Result<Option<String>> {
    let out = cmd::output(cmd::command("apt-cache").args(["search", "--names-only", SEARCH]))?;
    ensure!(out.status.success(), "apt-cache search failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let names = text.lines().filter_map(|l| l.split_whitespace().next());
    Ok(pick_newest(series, names))
}

fn pick_newest<'a>(series: &Series, names: impl Iterator<Item = &'a str>) -> Option<String> {
    names
        .filter_map(|name| {
            let number = name.strip_prefix(series.prefix)?.strip_suffix(series.suffix)?;
            Some((number.parse::<u64>().ok()?, name))
        })
        .max()
        .map(|(_, name)| name.to_string())
}

/// The unpacked package from the cache, downloading it first if needed.
fn fetch(package: &str, cache: &Path) -> Result<Kernel> {
    let dir = cache.join(package);
    if let Some(kernel) = unpacked(&dir)? {
        println!("integration-test vm: kernel {} (cached {})", kernel.name, package);
        return Ok(kernel);
    }
    let start = Instant::now();
    // Unpacked beside the cache and renamed into place: an interrupted
    // download never looks cached.
    let work = cache.join(format!(".{package}.partial"));
    if work.exists() {
        fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    download(package, &work)?;
    let deb = find_deb(&work)?;
    let root = work.join("root");
    extract_boot(&deb, &root)?;
    if dir.exists() {
        // An older, incomplete unpacking.
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::rename(&root, &dir).with_context(|| format!("moving {} to {}", root.display(), dir.display()))?;
    fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    let kernel =
        unpacked(&dir)?.with_context(|| format!("{package} holds no boot/vmlinuz-* or brd module"))?;
    println!("integration-test vm: fetched {package} in {:.1}s", start.elapsed().as_secs_f64());
    Ok(kernel)
}

/// The kernel in an unpacked package folder, if it is complete.
fn unpacked(dir: &Path) -> Result<Option<Kernel>> {
    let Some(vmlinuz) = find_file(&dir.join("boot"), |n| n.starts_with("vmlinuz-"))? else {
        return Ok(None);
    };
    let name = vmlinuz.file_name().context("a file name")?.to_string_lossy();
    let name = name.strip_prefix("vmlinuz-").unwrap_or_default().to_string();
    let drivers = dir.join("lib/modules").join(&name).join("kernel/drivers/block");
    let Some(brd) = find_file(&drivers, |n| n.starts_with("brd.ko"))? else {
        return Ok(None);
    };
    Ok(Some(Kernel { name, vmlinuz, ramdisk_module: Some(brd) }))
}

/// The first file in `dir` whose name `matches`; none if `dir` is missing.
fn find_file(dir: &Path, matches: impl Fn(&str) -> bool) -> Result<Option<PathBuf>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.file_name().and_then(|n| n.to_str()).is_some_and(&matches) {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

fn download(package: &str, into: &Path) -> Result<()> {
    let mut get = apt("apt-get");
    if cmd::is_root()? {
        // As root apt fetches as the _apt user, who cannot write here.
        get.args(["-o", "APT::Sandbox::User=root"]);
    }
    get.args(["download", package]).current_dir(into);
    cmd::run(&mut get).with_context(|| format!("downloading {package} (needs the Debian mirror)"))
}

fn find_deb(dir: &Path) -> Result<PathBuf> {
    find_file(dir, |n| n.ends_with(".deb"))?
        .with_context(|| format!("apt-get download left no .deb in {}", dir.display()))
}

/// `dpkg-deb --fsys-tarfile DEB | tar -x UNPACK...`: the image without the
/// other modules (a fifth of the package's size, quicker than `dpkg -x`).
fn extract_boot(deb: &Path, dest: &Path) -> Result<()> {
    fs::create_dir_all(dest).with_context(|| format!("creating {}", dest.display()))?;
    let mut tarfile = cmd::command("dpkg-deb");
    tarfile.arg("--fsys-tarfile").arg(deb).stdout(Stdio::piped());
    let mut producer = tarfile.spawn().context("could not start dpkg-deb")?;
    let pipe = producer.stdout.take().context("dpkg-deb's stdout")?;
    let mut tar = cmd::command("tar");
    tar.arg("-x").arg("-C").arg(dest).arg("--wildcards").args(UNPACK).stdin(pipe);
    let untarred = cmd::output(&mut tar)?;
    let produced = producer.wait().context("waiting for dpkg-deb")?;
    ensure!(produced.success(), "dpkg-deb --fsys-tarfile {} failed ({produced})", deb.display());
    ensure!(
        untarred.status.success(),
        "unpacking {}: tar failed: {}",
        deb.display(),
        String::from_utf8_lossy(&untarred.stderr)
    );
    Ok(())
}

/// apt-get or apt-cache, never asking questions.
pub fn apt(program: &str) -> Command {
    let mut c = cmd::command(program);
    c.env("DEBIAN_FRONTEND", "noninteractive");
    c
}

pub fn apt_update() -> Result<()> {
    cmd::run(apt("apt-get").arg("update"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_newest_package_of_a_series() {
        let names = [
            "linux-image-6.1.0-9-cloud-amd64-unsigned",
            "linux-image-6.1.0-57-cloud-amd64-unsigned",
            "linux-image-6.1.0-56-cloud-amd64-unsigned",
            "linux-image-6.1.0-57-cloud-amd64-dbg",
            "linux-image-6.12.117+deb12-cloud-amd64-unsigned",
            "linux-image-6.12.99+deb12-cloud-amd64-unsigned",
        ];
        let pick = |alias| pick_newest(SERIES.iter().find(|s| s.alias == alias).unwrap(), names.into_iter());
        assert_eq!(pick("6.1").as_deref(), Some("linux-image-6.1.0-57-cloud-amd64-unsigned"));
        assert_eq!(pick("6.12").as_deref(), Some("linux-image-6.12.117+deb12-cloud-amd64-unsigned"));
        assert_eq!(pick_newest(&SERIES[0], std::iter::empty()), None);
    }
}

//! Kernels to boot: Debian cloud kernels (bookworm's 6.1 and 6.12,
//! bullseye's 5.10) fetched with `apt-get download` and cached under
//! target/vm/kernels (only their boot/ folder and the RAM disk module are
//! unpacked), or a vmlinuz given by path. Bullseye's packages come from the
//! machine's own Debian mirror, through an apt source of their own
//! (`BULLSEYE_LIST`) that xtask adds the first time it needs one.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};

use crate::cmd;

/// Series booted when no `--kernel` is given, slowest suite first (the
/// trampoline pass): with two booted at once, the quick 5.10 follows
/// whichever of the others ends first.
pub const DEFAULT: [&str; 3] = ["6.1", "6.12", "5.10"];

/// A kernel series and its package names, `{prefix}{number}{suffix}`: the
/// cloud flavour has BTF and BPF built in and boots quickly in QEMU.
struct Series {
    alias: &'static str,
    prefix: &'static str,
    suffix: &'static str,
    /// A Debian suite the machine's sources may lack (added on demand).
    suite: Option<&'static str>,
}

const SERIES: [Series; 3] = [
    // bullseye's kernel: the oldest stall is tested on (docs/KERNELS.md)
    Series {
        alias: "5.10",
        prefix: "linux-image-5.10.0-",
        suffix: "-cloud-amd64-unsigned",
        suite: Some("bullseye"),
    },
    // bookworm's own kernel (main and bookworm-security)
    Series { alias: "6.1", prefix: "linux-image-6.1.0-", suffix: "-cloud-amd64-unsigned", suite: None },
    // the 6.12 LTS built for bookworm (bookworm-security)
    Series { alias: "6.12", prefix: "linux-image-6.12.", suffix: "+deb12-cloud-amd64-unsigned", suite: None },
];

/// The apt source xtask adds for bullseye's kernels (deb822, a file of its
/// own, so it is easy to see and to remove).
const BULLSEYE_LIST: &str = "/etc/apt/sources.list.d/stall-vm-bullseye.sources";
/// Where apt's sources live, to find the Debian mirror this machine uses.
const APT_SOURCES: [&str; 2] = ["/etc/apt/sources.list.d", "/etc/apt/sources.list"];
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
        None => bail!("not a file, a linux-image-* package, nor one of the series 5.10, 6.1, 6.12"),
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
    if let Some(suite) = series.suite {
        add_suite(suite)?;
    }
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

/// Adds `suite` (main) from the Debian mirror the machine's bookworm
/// sources name, with their keyring, as `BULLSEYE_LIST`.
fn add_suite(suite: &str) -> Result<()> {
    let path = Path::new(BULLSEYE_LIST);
    if path.exists() {
        return Ok(());
    }
    let mut texts = Vec::new();
    for place in APT_SOURCES {
        let p = Path::new(place);
        if p.is_dir() {
            for entry in fs::read_dir(p).with_context(|| format!("reading {place}"))? {
                let file = entry?.path();
                let name = file.to_string_lossy();
                if name.ends_with(".sources") || name.ends_with(".list") {
                    texts.push(fs::read_to_string(&file).unwrap_or_default());
                }
            }
        } else if p.is_file() {
            texts.push(fs::read_to_string(p).unwrap_or_default());
        }
    }
    let (uri, keyring) = texts
        .iter()
        .find_map(|t| debian_mirror(t))
        .context("no Debian bookworm source in /etc/apt to take the mirror from")?;
    let mut entry = format!("Types: deb\nURIs: {uri}\nSuites: {suite}\nComponents: main\n");
    if let Some(k) = keyring {
        entry.push_str(&format!("Signed-By: {k}\n"));
    }
    println!("integration-test vm: adding {suite} main from {uri} ({BULLSEYE_LIST})");
    fs::write(path, entry).with_context(|| format!("writing {BULLSEYE_LIST}"))
}

/// The URI (and keyring) of the main bookworm archive in an apt sources
/// file, deb822 (`URIs:`/`Suites:`) or one-line (`deb URI bookworm main`).
fn debian_mirror(text: &str) -> Option<(String, Option<String>)> {
    for stanza in text.split("\n\n") {
        let field =
            |key: &str| stanza.lines().find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()));
        if let (Some(uris), Some(suites)) = (field("URIs:"), field("Suites:")) {
            if suites.split_whitespace().any(|s| s == "bookworm") {
                let uri = uris.split_whitespace().next()?.to_string();
                return Some((uri, field("Signed-By:")));
            }
        }
    }
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace().filter(|w| !w.starts_with('['));
        (words.next()? == "deb").then_some(())?;
        let uri = words.next()?;
        (words.next()? == "bookworm").then(|| (uri.to_string(), None))
    })
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
        let old = ["linux-image-5.10.0-35-cloud-amd64-unsigned", "linux-image-5.10.0-9-cloud-amd64-unsigned"];
        assert_eq!(
            pick_newest(&SERIES[0], old.into_iter()).as_deref(),
            Some("linux-image-5.10.0-35-cloud-amd64-unsigned")
        );
    }

    #[test]
    fn finds_the_debian_mirror_in_apt_sources() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\nSigned-By: /k.gpg\n\nTypes: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            debian_mirror(deb822),
            Some(("http://mirror.example/debian".into(), Some("/k.gpg".into())))
        );
        let one_line = "deb [arch=amd64] http://m.example/debian bookworm main\n";
        assert_eq!(debian_mirror(one_line), Some(("http://m.example/debian".into(), None)));
        assert_eq!(debian_mirror("deb http://m.example/debian-security bookworm-security main"), None);
    }
}

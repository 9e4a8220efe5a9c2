//! `cargo xtask integration-test vm`: the privileged integration tests on
//! other kernels than the running one. Each kernel (Debian bookworm cloud
//! kernels by default, see docs/KERNELS.md) boots in QEMU with an initramfs
//! holding stall, the test binaries, their workloads and the userland they
//! need (busybox, Python); its /init runs the tests and prints one result
//! line on the serial console. Each kernel's runs are split into shards, one
//! boot each, all boots sharing the host's CPUs longest first (shard.rs);
//! a kernel's shards merge into its one row of the table. The host kernel
//! runs the same binaries natively, so the table compares like with like.

pub mod hooks_bench;
mod initramfs;
mod kernel;
mod native;
mod qemu;
mod shard;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::{build, cmd, setup};

/// Host tools the VM run needs, as Debian packages: QEMU, a static busybox
/// for the guest's /init and shell tools, cpio to write the initramfs.
const PACKAGES: [&str; 3] = ["qemu-system-x86", "busybox-static", "cpio"];
/// What `cargo xtask test` passes to `cargo test`: building the test
/// binaries the same way finds the very files it just ran.
const TEST_BUILD_ARGS: [&str; 5] = ["--workspace", "--exclude", "stall-ebpf", "--release", "--no-run"];
/// The crate holding the integration tests (its `tests/*.rs` targets).
const TESTS_MANIFEST: &str = "tests/Cargo.toml";
/// Per boot (one shard of a kernel's runs), from boot to power-off. The
/// slowest whole suite, 6.1's with its trampoline pass, takes about 19
/// minutes under TCG on a 2-CPU host, a shard of two about half that
/// (docs/KERNELS.md, "Measured times"): room for `--shards 1` on a host a
/// little slower, without a hung guest holding CI long.
const DEFAULT_TIMEOUT_SECS: u64 = 1800;
/// Tests left out in the VMs, as (binary, test): their verdicts are
/// calibrated on a real CPU. Under TCG the job's Python runs several times
/// slower, so its own CPU time changes the verdict (`trainer-host-bound`,
/// `input-cpu-bound` or `unknown` instead of what the scenario builds): the
/// first two failed on both kernels in every run, the third in one run of
/// five; the fourth is the first's job behind a CPU-bound start-up. The
/// four-rank runs are calibrated the same way: which rank holds the others
/// is a matter of CPU shares between thirteen Python processes; the VMs run
/// the two-rank one and the hung rank instead (and the PyTorch ones need
/// PyTorch, 5 GB, as do the torch.save
/// checkpoint, whose standard-library twin runs in the VMs, and the
/// Hugging Face datasets: mapped before fork, under a DataLoader, whose
/// standard-library twin, a table mapped before multiprocessing forks its
/// workers (causes.rs, tests/workloads/mapped_table.py), runs in the VMs:
/// the page faults on the inherited mapping, named by the file's path, are
/// the kernel-dependent part). They run natively. So do the
/// two schema checks of deploy/ (manifests.rs): their schemas are Python
/// packages (`cargo xtask test` installs them, 140 MB) and the VM image
/// carries a pruned standard library and no packages; nothing in them
/// depends on the kernel. The rest of manifests.rs runs in the VMs. And
/// the pods of kube.rs: containerd and runc are not in the VM image, and
/// nothing of what they check (names from the runtime) varies by kernel.
/// The SVG's folded helpers: the image's busybox shell runs `sh -c` in
/// its own process, so there are no helper processes to fold. The docs'
/// paths: the image carries no docs and no sources, and nothing about
/// them depends on the kernel. Of the launch chains (chains.rs), one
/// workload under every chain: the others walk the same exec and fork
/// paths, each as long (about 50 s a kernel under TCG).
const VM_SKIP: [(&str, &str); 42] = [
    ("scenarios", "cpu_bound_transforms"),
    ("scenarios", "a_short_run_is_judged_after_its_startup"),
    ("scenarios", "attach_to_cgroup"),
    ("scenarios", "attach_to_pid_mid_run"),
    ("ranks", "torchrun_like_run_names_the_slow_rank"),
    ("ranks", "mp_spawn_like_run_names_the_slow_rank"),
    ("ranks", "ranks_that_keep_pace_name_no_straggler"),
    ("ranks", "prometheus_names_the_straggler_across_two_nodes"),
    ("ranks", "srun_like_run_names_the_slow_rank"),
    ("ranks", "mpirun_like_run_names_the_slow_rank"),
    ("ranks", "torchrun_gloo_run_names_the_slow_rank"),
    ("ranks", "mp_spawn_rank_as_argument_with_forked_workers"),
    ("ranks", "mp_spawn_rank_as_argument_with_forkserver_workers"),
    ("ranks", "mp_spawn_rank_in_os_environ_with_forked_workers"),
    ("ranks", "mp_spawn_rank_in_os_environ_with_forkserver_workers"),
    ("ranks", "prometheus_names_the_straggler_of_an_mp_spawn_run_across_two_nodes"),
    ("ranks", "prometheus_names_the_straggler_of_an_mpirun_run_across_two_nodes"),
    ("ranks", "mp_spawn_ranks_that_keep_pace_name_no_straggler"),
    ("ranks", "ranks_started_last_first_are_the_index_they_were_given"),
    ("ranks", "ranks_a_fork_server_started_in_parallel_are_found"),
    ("causes", "torch_save_checkpoints_to_slow_storage_are_output_io_bound"),
    ("causes", "pages_of_a_dataset_mapped_before_fork_are_named_in_each_worker"),
    ("causes", "a_datasets_table_under_a_dataloader_names_what_the_workers_read"),
    ("causes", "every_shard_of_a_sharded_datasets_table_is_named_in_the_workers"),
    // Mounts the tests' FUSE server, which the VM image does not carry.
    ("causes", "workers_reading_a_slow_fuse_mount_name_the_filesystem_and_its_server"),
    ("manifests", "deploy_objects_pass_strict_schema_validation"),
    ("manifests", "schema_validation_rejects_misspelled_fields_wrong_types_and_missing_ones"),
    ("kube", "pods_run_by_containerd_are_named_as_the_kubelet_names_them"),
    ("timeline", "the_svg_groups_processes_folds_helpers_and_has_its_rows"),
    ("docs", "every_path_the_docs_cite_exists"),
    ("first_minutes", "the_readmes_use_section_works_as_written"),
    ("chains", "workers_that_sleep_under_every_chain"),
    ("chains", "an_evaluation_subprocess_under_every_chain"),
    ("chains", "loader_threads_on_slow_storage_under_every_chain"),
    ("chains", "a_deadlock_between_two_threads_under_every_chain"),
    ("chains", "dataloader_workers_on_slow_storage_under_every_chain"),
    ("chains", "stdout_into_a_slow_reader_under_every_chain"),
    // The image's busybox shell runs `sleep` in its own process: no helper
    // stands for the job before it runs.
    ("chains", "the_report_says_when_the_trainer_changed_and_why"),
    // The Unix-socket server runs in the VMs (the kernel's socket
    // diagnostics on each kernel); its TCP, cold-file and FIFO twins judge
    // the same other end through paths no kernel changes.
    ("waits", "a_feature_server_on_cpu_on_localhost_is_no_network_input"),
    ("waits", "a_feature_server_reading_cold_files_is_named_with_its_storage_reads"),
    ("waits", "a_fifo_writer_on_cpu_is_the_input"),
    // Attaches the probes to running ranks as the attach test beside it
    // does on every kernel; what differs is the role logic, no kernel's.
    ("nccl", "ranks_no_variable_names_attached_after_their_communicators_are_found_by_their_calls"),
];

#[derive(Subcommand)]
pub enum Target {
    /// Boot kernels in QEMU (TCG) and run the integration tests inside each,
    /// and natively on the running kernel; prints a table, fails if any fails
    Vm(VmArgs),
}

#[derive(Args)]
pub struct VmArgs {
    /// Kernel to boot, repeatable: `5.10`, `6.1` or `6.12` (the newest Debian
    /// cloud kernel of that series: bullseye's, bookworm's), a `linux-image-*`
    /// package, or a vmlinuz path. Default: 5.10, 6.1 and 6.12
    #[arg(long = "kernel", value_name = "SPEC")]
    kernels: Vec<String>,
    /// Seconds one boot (one shard of a kernel's runs) may take from boot
    /// to power-off
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_SECS)]
    timeout: u64,
    /// Boots per kernel, each running a share of its test runs (the
    /// expensive ones spread), so that the slots share out all kernels' work
    #[arg(long, value_name = "N", default_value_t = shard::DEFAULT_SHARDS,
          value_parser = clap::value_parser!(u16).range(1..=16))]
    shards: u16,
    /// Do not run the tests natively on the running kernel
    #[arg(long)]
    no_host: bool,
    /// Kernels booted at once (default: one per host CPU, each VM being one
    /// host thread under single-threaded TCG)
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Test harness arguments, after `--` (a name filter, --skip NAME, --test-threads N)
    #[arg(last = true)]
    args: Vec<String>,
}

/// One row of the result table.
struct Row {
    kernel: String,
    place: &'static str,
    boot: Option<Duration>,
    tests: Option<Duration>,
    passed: bool,
    detail: String,
}

/// `cargo xtask integration-test vm`: builds, then runs natively (unless
/// `--no-host`) and in each VM.
pub fn run_cli(target: Target) -> Result<()> {
    let Target::Vm(opts) = target;
    if !opts.no_host {
        cmd::require_root("the native run loads eBPF programs and needs root (or pass --no-host)")?;
    }
    setup::ensure()?;
    setup::ensure_test_packages()?;
    let stall = build::agent(true)?;
    build::nvml_script(true)?;
    build::cuda_stub(true)?;
    build::nccl_stub(true)?;
    let tests = test_binaries()?;
    let host = if opts.no_host { None } else { Some(native::run(&stall, &tests, &opts.args)?) };
    run_vms(&stall, &tests, &opts, host)
}

/// Called by `cargo xtask test` once the native tests passed: the same
/// binaries on the default kernels.
pub fn after_native_tests(stall: &Path, args: &[String]) -> Result<()> {
    let tests = test_binaries()?;
    let opts = VmArgs {
        kernels: Vec::new(),
        timeout: DEFAULT_TIMEOUT_SECS,
        no_host: true,
        shards: shard::DEFAULT_SHARDS,
        jobs: None,
        args: args.to_vec(),
    };
    let host = Row {
        kernel: native::kernel_release(),
        place: "native",
        boot: None,
        tests: None,
        passed: true,
        detail: "PASS (cargo test, just before)".into(),
    };
    run_vms(stall, &tests, &opts, Some(host))
}

fn run_vms(stall: &Path, tests: &[TestBin], opts: &VmArgs, host: Option<Row>) -> Result<()> {
    let start = Instant::now();
    ensure_packages()?;
    let dir = vm_dir();
    let specs: Vec<String> = if opts.kernels.is_empty() {
        kernel::DEFAULT.iter().map(|s| s.to_string()).collect()
    } else {
        opts.kernels.clone()
    };
    let kernels = kernel::resolve_all(&specs, &dir.join("kernels"))?;
    let nvml = build::nvml_script_next_to(stall)?;
    let cuda = build::cuda_stub_next_to(stall)?;
    let nccl = build::nccl_stub_next_to(stall)?;
    let gpu = initramfs::GpuLibs { nvml_script: &nvml, cuda_stub: &cuda, nccl_stub: &nccl };
    let initramfs = initramfs::build(&dir, stall, &gpu, tests, &VM_SKIP, &kernels, &[])?;
    let harness = qemu::harness_args(&opts.args);
    let jobs = opts.jobs.unwrap_or_else(host_cpus);
    let mut rows: Vec<Row> = host.into_iter().collect();
    let boots = shard::boots(kernels.len(), usize::from(opts.shards));
    let outcomes = boot_all(&boots, jobs, |&(k, shard)| {
        let k = &kernels[k];
        let name = match shard.tag() {
            Some(tag) => format!("{}-{tag}.log", k.name),
            None => format!("{}.log", k.name),
        };
        let log = dir.join("logs").join(name);
        qemu::boot(k, Some(shard), &initramfs, &harness, Duration::from_secs(opts.timeout), &log)
    });
    let mut per_kernel: Vec<Vec<(shard::Shard, qemu::Outcome)>> =
        kernels.iter().map(|_| Vec::new()).collect();
    for (&(k, shard), outcome) in boots.iter().zip(outcomes) {
        per_kernel[k].push((shard, outcome?));
    }
    for (k, shards) in kernels.iter().zip(&per_kernel) {
        rows.push(shard::merge(&k.name, shards));
    }
    print!("{}", table(&rows));
    let skipped: Vec<String> = VM_SKIP.iter().map(|(bin, test)| format!("{bin}::{test}")).collect();
    println!(
        "  not run in the VMs (CPU-speed-calibrated verdicts, or PyTorch, containerd or the manifests' schema packages, or the FUSE server, which the VM image lacks, or the docs and the README; three of the four workloads under every launch chain; the feature server's twins): {}",
        skipped.join(", ")
    );
    println!("integration-test vm: {:.0}s in all", start.elapsed().as_secs_f64());
    let failed: Vec<&str> = rows.iter().filter(|r| !r.passed).map(|r| r.kernel.as_str()).collect();
    ensure!(
        failed.is_empty(),
        "integration tests failed on {} (console logs in {})",
        failed.join(", "),
        dir.join("logs").display()
    );
    Ok(())
}

/// The host's CPUs, at least one.
fn host_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `boot` for each of `boots`, `jobs` at a time (at least one), in
/// their order (longest first: shard::boots); the results in that order.
/// Under single-threaded TCG each guest is one busy host thread, so on a
/// 2-CPU host two boots side by side take the time of one each: the
/// phase's wall time is the longest chain, which shards keep short.
fn boot_all<B: Sync, T: Send>(
    boots: &[B],
    jobs: usize,
    boot: impl Fn(&B) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<T>>>> =
        boots.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, boots.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(b) = boots.get(i) else { break };
                let outcome = boot(b);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .unwrap_or_else(|| Err(anyhow::anyhow!("not booted")))
        })
        .collect()
}

/// target/vm: kernels, the initramfs and its staging tree, console logs.
fn vm_dir() -> PathBuf {
    cmd::target_dir().join("vm")
}

/// An integration test binary: its target name (`capture`) and path.
pub struct TestBin {
    pub name: String,
    pub path: PathBuf,
}

/// Builds the integration tests (a no-op after `cargo xtask test`) and
/// returns their binaries, from cargo's JSON messages.
fn test_binaries() -> Result<Vec<TestBin>> {
    let mut build = cmd::cargo();
    build.arg("test").args(TEST_BUILD_ARGS).arg("--message-format=json-render-diagnostics");
    let shown = cmd::describe(&build);
    println!("xtask: $ {shown}");
    build.stderr(std::process::Stdio::inherit());
    let out = cmd::output(&mut build)?;
    ensure!(out.status.success(), "`{shown}` failed ({})", out.status);
    let manifest = cmd::workspace_root().join(TESTS_MANIFEST);
    let text = String::from_utf8(out.stdout).context("cargo printed non-UTF-8")?;
    let bins = parse_test_binaries(&text, &manifest)?;
    ensure!(!bins.is_empty(), "cargo built no test binaries for {}", manifest.display());
    Ok(bins)
}

fn parse_test_binaries(json_lines: &str, manifest: &Path) -> Result<Vec<TestBin>> {
    let mut bins = Vec::new();
    for line in json_lines.lines().filter(|l| l.starts_with('{')) {
        let msg: Value = serde_json::from_str(line).with_context(|| format!("cargo message: {line}"))?;
        let is_test = msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test"));
        if msg["reason"] != "compiler-artifact"
            || !is_test
            || msg["manifest_path"].as_str() != manifest.to_str()
        {
            continue;
        }
        if let (Some(name), Some(exe)) = (msg["target"]["name"].as_str(), msg["executable"].as_str()) {
            bins.push(TestBin { name: name.to_string(), path: PathBuf::from(exe) });
        }
    }
    bins.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(bins)
}

/// Installs [`PACKAGES`] if any is missing (as `cargo xtask setup` does for
/// the BPF toolchain: nothing is installed when all are there).
fn ensure_packages() -> Result<()> {
    let missing = missing_packages()?;
    if missing.is_empty() {
        return Ok(());
    }
    let install = format!("apt-get install -y --no-install-recommends {}", missing.join(" "));
    ensure!(cmd::is_root()?, "the VM run needs {}; as root: {install}", missing.join(" "));
    println!("integration-test vm: installing {}", missing.join(" "));
    kernel::apt_update()?;
    let mut apt = kernel::apt("apt-get");
    cmd::run(apt.args(["install", "-y", "--no-install-recommends"]).args(&missing))
}

fn missing_packages() -> Result<Vec<&'static str>> {
    let mut query = cmd::command("dpkg-query");
    query.args(["-W", "-f=${Package}\t${Status}\n"]).args(PACKAGES);
    // dpkg-query exits 1 when a package is unknown; the others are still listed.
    let out = cmd::output(&mut query)?;
    let text = String::from_utf8_lossy(&out.stdout);
    let installed: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .filter(|(_, status)| *status == "install ok installed")
        .map(|(name, _)| name)
        .collect();
    Ok(PACKAGES.into_iter().filter(|p| !installed.contains(p)).collect())
}

fn table(rows: &[Row]) -> String {
    let secs = |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.1}s", d.as_secs_f64()));
    let width = rows.iter().map(|r| r.kernel.len()).max().unwrap_or(0).max(6);
    let mut out = String::from("\nintegration tests per kernel:\n");
    let _ = writeln!(out, "  {:width$}  {:6}  {:>6}  {:>6}  result", "kernel", "where", "boot", "tests");
    for r in rows {
        let _ = writeln!(
            out,
            "  {:width$}  {:6}  {:>6}  {:>6}  {}",
            r.kernel,
            r.place,
            secs(r.boot),
            secs(r.tests),
            r.detail
        );
    }
    out
}

/// Fails unless `path` exists; the message names what provides it.
fn require_file(path: &Path, from: &str) -> Result<()> {
    if !path.exists() {
        bail!("{} not found (it comes from {from})", path.display());
    }
    Ok(())
}

/// Creates `path`'s parent directories.
fn create_parent(path: &Path) -> Result<()> {
    let parent = path.parent().context("a path with a parent")?;
    fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_integration_test_binaries_in_cargo_messages() {
        let manifest = Path::new("/w/tests/Cargo.toml");
        let text = r#"{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"name":"run"},"executable":"/w/target/release/deps/run-1"}
{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["lib"],"name":"stall_tests"},"executable":"/w/target/release/deps/stall_tests-2"}
{"reason":"compiler-artifact","manifest_path":"/w/stall-agent/Cargo.toml","target":{"kind":["test"],"name":"x"},"executable":"/w/x"}
{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"name":"capture"},"executable":"/w/target/release/deps/capture-3"}
{"reason":"build-finished","success":true}"#;
        let bins = parse_test_binaries(text, manifest).unwrap();
        let names: Vec<&str> = bins.iter().map(|b| b.name.as_str()).collect();
        assert_eq!(names, ["capture", "run"]);
        assert_eq!(bins[1].path, Path::new("/w/target/release/deps/run-1"));
    }

    #[test]
    fn boots_run_in_order_at_most_jobs_at_a_time() {
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        for jobs in [0, 1, 2, 3] {
            let (running, most, started) = (AtomicUsize::new(0), AtomicUsize::new(0), AtomicUsize::new(0));
            let boots = [40u64, 30, 20, 10, 5];
            let results = boot_all(&boots, jobs, |&w| {
                let order = started.fetch_add(1, SeqCst);
                most.fetch_max(running.fetch_add(1, SeqCst) + 1, SeqCst);
                std::thread::sleep(Duration::from_millis(w));
                running.fetch_sub(1, SeqCst);
                Ok((w, order))
            });
            let results: Vec<(u64, usize)> = results.into_iter().map(Result::unwrap).collect();
            // Results in the boots' order; each started no later than the next.
            assert_eq!(results.iter().map(|r| r.0).collect::<Vec<_>>(), boots);
            assert!(results.iter().map(|r| r.1).eq(0..boots.len()), "{results:?}");
            assert_eq!(most.load(SeqCst), jobs.max(1), "{jobs} jobs");
        }
    }

    #[test]
    fn table_lines_up() {
        let row = |kernel: &str, passed| Row {
            kernel: kernel.into(),
            place: "qemu",
            boot: Some(Duration::from_millis(3100)),
            tests: None,
            passed,
            detail: "PASS 3 passed".into(),
        };
        let text = table(&[row("6.1.0-57-cloud-amd64", true), row("6.12", false)]);
        assert!(text.contains("  6.1.0-57-cloud-amd64  qemu      3.1s       -  PASS 3 passed\n"), "{text}");
        assert!(text.contains("  6.12                  qemu"), "{text}");
    }
}

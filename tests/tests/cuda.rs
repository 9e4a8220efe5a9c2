//! The job's own CUDA calls, seen through uprobes on the library it loads:
//! a stand-in CUDA runtime and driver (tests/cuda-stub: the real exported
//! names and C signatures; streams are threads; synchronizations spin,
//! yield or block as the device flags say) that cuda_job.py loads through
//! ctypes a second after stall started, as PyTorch loads libcudart. The
//! truth is what the job measured around each of its calls.
use std::{path::Path, process::Command, time::Duration};

use serde_json::Value;
use stall_tests::assert::assert_close;
use stall_tests::gpu::cuda_stub_lib;
use stall_tests::procs::{wait_child, wait_until};
use stall_tests::scratch::Scratch;
use stall_tests::stall::{bpf_programs_of, require_root, stall, still_loaded, Background, Run};
use stall_tests::workload::{python, secs, truth};

fn cuda_job_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/cuda_job.py").display().to_string()
}

/// A scratch directory holding the stand-in library under the CUDA
/// runtime's file name (how stall recognises the library it probes).
fn library(tag: &str) -> (Scratch, String) {
    let dir = Scratch::new(tag);
    let lib = dir.path("libcudart.so.13");
    std::fs::copy(cuda_stub_lib(), &lib).expect("copy the stand-in CUDA library");
    let lib = lib.display().to_string();
    (dir, lib)
}

/// cuda_job.py `mode` under `stall run` for 4 s, the library loaded 2.5 s
/// after start and the steps begun once stall's probes are in it (so that
/// the job's own counts are what stall could see; under TCG the probes
/// take a while): the run and the job's truth. The load comes after stall's
/// first tick even in a loaded VM: probing the library holds the ticks
/// back, and a job whose GPU runs in the first interval has no startup
/// set apart (its whole run is judged).
fn cuda_job(tag: &str, mode: &str, extra: &[&str]) -> (Run, Value) {
    require_root();
    let (dir, lib) = library(tag);
    let (truth_path, log) = (dir.path("truth.json"), dir.path("train.log"));
    let script = cuda_job_py();
    let mut argv = vec!["run", "-q", "--", python(), &script, mode, "--lib", &lib, "--seconds", "4"];
    let (truth_arg, log_arg) = (truth_path.display().to_string(), log.display().to_string());
    argv.extend(["--truth", &truth_arg, "--log", &log_arg, "--load-after", "2.5", "--wait-probed", "60"]);
    argv.extend(extra);
    let run = stall(&argv, &[], Duration::from_secs(150));
    assert_eq!(run.status, 0, "stall run failed:\n{}", run.stderr);
    let t = truth(&truth_path);
    assert_eq!(t["probed"], true, "stall never probed the library: {t}\n{}", run.stderr);
    let s = run.summary();
    eprintln!(
        "{mode}: library loaded at {} s, probed {} s later, {} s of steps; stall's startup {} s of {} s",
        t["loaded_at_s"], t["probed_wait_s"], t["seconds"], s["startup_s"], s["elapsed_s"]
    );
    (run, t)
}

fn verdict(run: &Run) -> (&str, &str) {
    let v = &run.summary()["verdict"];
    (v["kind"].as_str().unwrap(), v["summary"].as_str().unwrap())
}

/// The job's main thread's calls as stall counted them.
fn calls<'a>(run: &'a Run, truth: &Value) -> &'a Value {
    let t = run.thread(truth["tid_main"].as_u64().unwrap());
    assert!(t["gpu_calls"].is_object(), "no GPU library calls seen for the main thread: {t}");
    &t["gpu_calls"]
}

fn count(v: &Value) -> f64 {
    v.as_u64().unwrap() as f64
}

/// A trainer whose every step waits for its GPU in cudaStreamSynchronize,
/// under CUDA's default schedule (a spin): on CPU nearly all the time, and
/// yet `gpu-busy`, with its time inside the calls as the job measured it.
#[test]
fn a_trainer_spinning_in_a_stream_synchronization_waits_for_its_gpu() {
    let (run, t) = cuda_job("cuda-spin", "sync", &["--schedule", "spin"]);
    let c = calls(&run, &t);
    let (kind, line) = verdict(&run);
    eprintln!("spin: stall {c}; job sync_s {} in {} calls; {line}", t["sync_s"], t["sync_calls"]);
    assert_close("time inside synchronizations", secs(&c["sync_s"]), secs(&t["sync_s"]), 0.05);
    assert_close("synchronizations", count(&c["sync_calls"]), count(&t["sync_calls"]), 0.05);
    assert_close("launches", count(&c["launches"]), count(&t["launches"]), 0.05);
    let main = run.thread(t["tid_main"].as_u64().unwrap());
    assert!(
        secs(&main["on_cpu_s"]) >= 0.5 * secs(&c["sync_s"]),
        "a spinning synchronization keeps the thread on CPU: {main}"
    );
    assert_eq!(kind, "gpu-busy", "{line}");
    assert!(line.contains("inside CUDA synchronizations") && line.contains("spinning"), "{line}");
}

/// The same through events, with the blocking schedule: off CPU in the
/// call, `gpu-busy` all the same.
#[test]
fn a_trainer_blocked_in_an_event_synchronization_waits_for_its_gpu() {
    let (run, t) = cuda_job("cuda-block", "sync", &["--schedule", "block", "--sync", "event"]);
    let c = calls(&run, &t);
    let (kind, line) = verdict(&run);
    eprintln!("block: stall {c}; job sync_s {}; {line}", t["sync_s"]);
    assert_close("time inside synchronizations", secs(&c["sync_s"]), secs(&t["sync_s"]), 0.05);
    assert_eq!(kind, "gpu-busy", "{line}");
    assert!(line.contains("inside CUDA synchronizations") && line.contains("blocked"), "{line}");
}

/// A host that launches thousands of tiny kernels per step: the trainer is
/// on CPU and barely waits for the GPU; its line names the launch rate.
#[test]
fn a_launch_bound_host_is_named_with_its_launch_rate() {
    let (run, t) = cuda_job("cuda-launch", "launch", &[]);
    let c = calls(&run, &t);
    let (kind, line) = verdict(&run);
    eprintln!("launch: stall {c}; job launches {}; {line}", t["launches"]);
    assert_close("launches", count(&c["launches"]), count(&t["launches"]), 0.05);
    assert_eq!(kind, "trainer-host-bound", "{line}");
    assert!(line.contains(" GPU kernels/s") && line.contains("cannot launch kernels fast enough"), "{line}");
}

/// Synchronous device-to-host copies of 64 MiB at 1 GB/s: the trainer
/// waits in cudaMemcpy; the line names the copies, their bytes and rate.
#[test]
fn synchronous_copies_are_named_with_their_bytes_and_rate() {
    let (run, t) = cuda_job("cuda-copy", "copy", &["--copy-mbps", "1000"]);
    let c = calls(&run, &t);
    let (kind, line) = verdict(&run);
    eprintln!(
        "copy: stall {c}; job {} copies, {} bytes in {} s; {line}",
        t["copies"], t["copy_bytes"], t["copy_s"]
    );
    assert_close("copies", count(&c["copy_calls"]), count(&t["copies"]), 0.05);
    assert_close("bytes copied", count(&c["copy_bytes"]), count(&t["copy_bytes"]), 0.05);
    assert_close("time in copies", secs(&c["copy_s"]), secs(&t["copy_s"]), 0.05);
    assert_eq!(kind, "trainer-host-bound", "{line}");
    assert!(line.contains("inside synchronous CUDA copies"), "{line}");
    // "... copies, 3.9 GB at 1000 MB/s)"
    let rate = line
        .split_once(" at ")
        .and_then(|(_, rest)| rest.split_once(" MB/s"))
        .and_then(|(n, _)| n.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no rate in {line}"));
    let want = count(&t["copy_bytes"]) / secs(&t["copy_s"]) / 1e6;
    assert_close("copy rate", rate, want, 0.1);
}

/// stall attached to a job already running with the library loaded (found
/// in its mappings) probes it; stopped, it leaves no program behind (leak.rs
/// shows the same after SIGKILL), and the job runs on to its end.
#[test]
fn probes_on_a_running_jobs_library_go_with_stall() {
    require_root();
    let (dir, lib) = library("cuda-attach");
    let (truth_path, log) = (dir.path("truth.json"), dir.path("train.log"));
    let mut job = Command::new(python());
    // Its steps start once the probes are in (an int3 at each function it
    // calls): its log says when, on any kernel.
    job.args([&cuda_job_py(), "sync", "--lib", &lib, "--seconds", "6", "--schedule", "block"])
        .args(["--wait-probed", "60", "--truth"])
        .arg(&truth_path)
        .arg("--log")
        .arg(&log)
        .stdout(std::process::Stdio::null());
    let mut job = job.spawn().expect("start the CUDA job");
    let maps = format!("/proc/{}/maps", job.id());
    wait_until("the job maps its CUDA library", Duration::from_secs(20), || {
        std::fs::read_to_string(&maps).is_ok_and(|m| m.contains("libcudart.so.13"))
    });
    let mut bg = Background::start(&["attach", "--pid", &job.id().to_string(), "-q", "--interval", "0.2"]);
    bg.wait_attached(Duration::from_secs(30));
    wait_until("stall probes the library", Duration::from_secs(60), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("step 1 "))
    });
    let ours = bpf_programs_of(bg.pid());
    let ids: Vec<u32> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ours.contains(&p.id()) && p.name_as_str().is_some_and(|n| n.starts_with("gpu_")))
        .map(|p| p.id())
        .collect();
    assert_eq!(ids.len(), 4, "the GPU library family's four programs: {ids:?}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(bg.pid() as i32), nix::sys::signal::Signal::SIGTERM)
        .unwrap();
    let run = bg.finish(Duration::from_secs(30));
    assert_eq!(run.status, 0, "stall exits cleanly on SIGTERM: {}", run.stderr);
    assert!(
        run.summary()["gpu_probes"].as_str().is_some_and(|l| l.contains("libcudart.so.13")),
        "{}",
        run.stderr
    );
    wait_until("the GPU programs are unloaded", Duration::from_secs(5), || still_loaded(&ids).is_empty());
    let status = wait_child(&mut job, Duration::from_secs(60)).expect("the job ends");
    assert!(status.success(), "the job was harmed: {status}");
    let t = truth(&truth_path);
    assert_eq!(t["probed"], true, "{t}");
    assert!(t["sync_calls"].as_u64().unwrap() > 50, "the job ran on: {t}");
}

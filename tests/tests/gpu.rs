//! The GPU side end to end, without a GPU: stall loads the scripted NVML
//! library (`tests/nvml-script`) with `--nvml-lib`, and a JSON script says
//! what the device does.
use std::{process::Command, time::Duration};

use serde_json::{json, Value};
use stall_agent::gpu::{open_with_library, GpuSelect};
use stall_tests::assert::assert_close;
use stall_tests::gpu::{nvml_script_lib, ScriptedGpu};
use stall_tests::procs::run_with_timeout;
use stall_tests::stall::{require_root, stall_bin};

const TIMEOUT: Duration = Duration::from_secs(60);

/// One H200-like device in a single endless phase.
fn device(phase: Value, extra: Value) -> Value {
    let mut d = json!({
        "name": "Scripted H200",
        "mem_total_bytes": 150_000_000_000u64,
        "power_limit_mw": 700_000,
        "phases": [phase],
    });
    for (k, v) in extra.as_object().unwrap() {
        d[k] = v.clone();
    }
    json!({ "devices": [d] })
}

struct Out {
    status: i32,
    stderr: String,
    records: Vec<Value>,
}

impl Out {
    fn summary(&self) -> &Value {
        self.records
            .iter()
            .rev()
            .find(|r| r["type"] == "summary")
            .unwrap_or_else(|| panic!("no summary record; stderr:\n{}", self.stderr))
    }
}

/// `stall run --json - [extra] -- cmd...` against `gpu`.
fn run(gpu: &ScriptedGpu, extra: &[&str], cmd: &[&str]) -> Out {
    require_root();
    let mut c = gpu.command("run");
    c.args(["--json", "-"]).args(extra).arg("--").args(cmd);
    let out = run_with_timeout(c, TIMEOUT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    Out {
        status: out.status.code().unwrap_or(-1),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        records: stdout
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| serde_json::from_str(l).expect("each JSON line parses"))
            .collect(),
    }
}

#[test]
fn busy_gpu_is_sampled_through_the_scripted_library() {
    let gpu = ScriptedGpu::new(&json!(null));
    let pid_file = gpu.path("trainer.pid");
    gpu.update(&device(
        json!({"util_pct": 100, "power_mw": 650_000, "mem_used_bytes": 20_000_000_000u64,
               "processes": [{"pid_file": pid_file, "used_mem_bytes": 20_000_000_000u64, "sm_util_pct": 97}]}),
        json!({}),
    ));
    let script = format!("echo $$ > {}; exec sleep 3", pid_file.display());
    let out = run(&gpu, &[], &["sh", "-c", &script]);
    assert_eq!(out.status, 0, "{}", out.stderr);
    let s = out.summary();
    assert_eq!(s["gpu_available"], true, "{s}");
    let gpus = s["gpus"].as_array().expect("gpus[]");
    assert_eq!(gpus.len(), 1, "{s}");
    let g = &gpus[0];
    assert_eq!(g["index"], 0);
    assert_eq!(g["name"], "Scripted H200");
    // ~6 buffered samples a second over ~3 s.
    let samples = g["samples"].as_u64().unwrap();
    assert!(samples >= 10, "{g}");
    assert_close("GPU utilization", g["util_mean_pct"].as_f64().unwrap(), 100.0, 0.05);
    assert!(g["idle_fraction"].as_f64().unwrap() < 0.05, "{g}");
    assert_eq!(s["verdict"]["host_only"], false, "{s}");
    assert!(!out.stderr.contains("no NVML"), "{}", out.stderr);
}

#[test]
fn script_changes_apply_while_stall_runs() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    // Idle until stall's first interval record (it samples by then, however
    // slow its start-up), then rewritten to fully busy for the rest of the
    // command: the mean lands between.
    require_root();
    let gpu = ScriptedGpu::new(&device(json!({"util_pct": 0, "power_mw": 80_000}), json!({})));
    let mut c = gpu.command("run");
    c.args(["--json", "-", "--", "sleep", "4"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut child = c.spawn().expect("start stall");
    let pid = child.id() as i32;
    let (done, waited) = std::sync::mpsc::channel::<()>();
    let killer = std::thread::spawn(move || {
        // Only while it has not been reaped, so the PID is still its own.
        if waited.recv_timeout(TIMEOUT).is_err() {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    });
    let mut summary = None;
    let mut updated = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let rec: Value = serde_json::from_str(&line.unwrap()).expect("each JSON line parses");
        if rec["type"] == "interval" && !updated {
            gpu.update(&device(json!({"util_pct": 100, "power_mw": 650_000}), json!({})));
            updated = true;
        }
        if rec["type"] == "summary" {
            summary = Some(rec);
        }
    }
    let status = child.wait().unwrap();
    let _ = done.send(());
    killer.join().unwrap();
    assert!(status.success(), "{status}");
    assert!(updated, "no interval record");
    let g = summary.expect("a summary record")["gpus"][0].clone();
    let mean = g["util_mean_pct"].as_f64().unwrap();
    let idle = g["idle_fraction"].as_f64().unwrap();
    assert!((10.0..=90.0).contains(&mean), "{g}");
    assert!((0.1..=0.9).contains(&idle), "{g}");
}

#[test]
fn lost_gpu_mid_run_is_a_warning_not_a_crash() {
    let gpu = ScriptedGpu::new(&device(
        json!({"util_pct": 100, "power_mw": 650_000}),
        json!({"lost_after_s": 1.0}),
    ));
    let out = run(&gpu, &[], &["sh", "-c", "sleep 3; exit 3"]);
    assert_eq!(out.status, 3, "the command's status, whatever the GPU does: {}", out.stderr);
    assert!(
        out.stderr.lines().any(|l| l.starts_with("stall: GPU 0 ") && l.contains("fell off the bus")),
        "a warning about the lost GPU: {}",
        out.stderr
    );
    // The run still ends with its summary.
    out.summary();
}

#[test]
fn missing_script_is_the_one_line_no_nvml_note() {
    require_root();
    let gpu = ScriptedGpu::new(&json!(null));
    let missing = gpu.path("no-such-script.json");
    let stall = |extra: &[&str]| {
        let mut c = Command::new(stall_bin());
        c.arg("run")
            .args(gpu.args())
            .args(extra)
            .args(["-q", "--", "true"])
            .env("STALL_NVML_SCRIPT", &missing);
        let out = run_with_timeout(c, TIMEOUT);
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    // Not asked for: a note, and on with the CPU side.
    let (code, err) = stall(&[]);
    assert_eq!(code, 0, "{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.contains("no NVML")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(notes[0].starts_with("stall: no NVML: GPU side not sampled ("), "{err}");
    // Asked for with --gpu 0: exit 6, one line.
    let (code, err) = stall(&["--gpu", "0"]);
    assert_eq!(code, 6, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    // An error, not the note a run that goes on prints, with both ways out.
    assert!(err.starts_with("stall: cannot sample the GPUs --gpu asks for: no NVML ("), "{err}");
    assert!(err.contains("--nvml-lib") && err.contains("--gpu off"), "{err}");
}

#[test]
fn unloadable_nvml_lib_with_explicit_gpu_exits_6() {
    require_root();
    let mut c = Command::new(stall_bin());
    c.args(["run", "--nvml-lib", "/nonexistent/libnvidia-ml.so.1", "--gpu", "0", "-q", "--", "true"]);
    let out = run_with_timeout(c, TIMEOUT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(
        err.starts_with("stall: cannot sample") && err.contains("/nonexistent/libnvidia-ml.so.1"),
        "{err}"
    );
}

#[test]
fn stall_reads_power_memory_and_per_process_sm_through_the_library() {
    // In this process, through stall's own NVML code (the JSON output does
    // not carry power or per-process figures).
    let gpu = ScriptedGpu::new(&device(
        json!({"util_pct": 100, "power_mw": 650_000, "mem_used_bytes": 21_000_000_000u64,
               "processes": [{"pid": 4242, "used_mem_bytes": 20_000_000_000u64, "sm_util_pct": 97},
                             {"pid": 4343, "sm_util_pct": 0}]}),
        json!({}),
    ));
    let (k, v) = gpu.env();
    std::env::set_var(k, v);
    let lib = nvml_script_lib();
    let mut src = match open_with_library(&GpuSelect::All, lib.as_os_str()) {
        Ok(Some(src)) => src,
        Ok(None) => panic!("no source"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(src.devices(), vec![(0, "Scripted H200".to_string())]);
    std::thread::sleep(Duration::from_millis(700));
    let snaps = src.poll();
    assert_eq!(snaps.len(), 1, "{snaps:?}");
    let s = &snaps[0];
    assert_eq!((s.index, s.name.as_str()), (0, "Scripted H200"));
    assert!(s.samples.len() >= 3 && s.samples.iter().all(|x| x.util_pct == 100.0), "{s:?}");
    assert_eq!((s.mem_used_bytes, s.mem_total_bytes), (21_000_000_000, 150_000_000_000));
    assert_eq!((s.power_mw, s.power_limit_mw), (Some(650_000), Some(700_000)));
    let procs: Vec<_> = s.processes.iter().map(|p| (p.pid, p.used_mem_bytes, p.sm_util_pct)).collect();
    assert_eq!(procs, vec![(4242, Some(20_000_000_000), Some(97.0)), (4343, None, Some(0.0))]);
    let warnings = src.take_warnings();
    assert!(warnings.is_empty(), "{warnings:?}");
}

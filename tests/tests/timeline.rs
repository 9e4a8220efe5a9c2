//! `--timeline`: the Chrome trace and the SVG of ground-truth workloads.
use std::{path::Path, time::Duration};

use serde_json::{json, Value};
use stall_tests::assert::assert_close;
use stall_tests::gpu::ScriptedGpu;
use stall_tests::procs::run_with_timeout;
use stall_tests::scratch::Scratch;
use stall_tests::stall::{require_root, stall, Run};
use stall_tests::workload::{jobs_py, python, secs, truth};

const T: Duration = Duration::from_secs(120);

fn trace(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("the timeline is JSON")
}

/// Thread `tid`'s slices named `name`.
fn slices<'a>(v: &'a Value, tid: u64, name: &'a str) -> impl Iterator<Item = &'a Value> {
    v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(move |e| e["ph"] == "X" && e["tid"] == tid && e["name"] == name)
}

fn slice_count(v: &Value, tid: u64, name: &str) -> usize {
    slices(v, tid, name).count()
}

/// Seconds of `tid`'s slices named `name`.
fn slice_secs(v: &Value, tid: u64, name: &str) -> f64 {
    slices(v, tid, name).map(|e| e["dur"].as_f64().unwrap() / 1e6).sum()
}

/// What to look at when a thread's slices and the summary disagree.
fn diagnosis(run: &Run, v: &Value, tid: u64) -> String {
    let sum = run.summary();
    let slices: Vec<String> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["tid"] == tid)
        .map(|e| format!("{}@{}+{}", e["name"].as_str().unwrap_or("?"), e["ts"], e["dur"]))
        .collect();
    format!(
        "sched_gaps {} sched_repaired {} lost {} {}; thread {}; slices {}",
        sum["sched_gaps"],
        sum["sched_repaired"],
        sum["lost_events"],
        sum["lost_by_cause"],
        run.thread(tid),
        slices.join(" ")
    )
}

/// The waits workload: a futex thread, a poll thread and a burner, with
/// their own measured times; every slice well formed, and each thread's
/// slices adding up to the JSON summary's numbers.
#[test]
fn slices_match_ground_truth_and_the_summary() {
    require_root();
    let s = Scratch::new("timeline");
    let truth_path = s.path("truth.json");
    let tl = s.path("trace.json");
    let svg = s.path("trace.svg");
    let run = stall(
        &[
            "run",
            "--timeline",
            tl.to_str().unwrap(),
            "--timeline-svg",
            svg.to_str().unwrap(),
            "--",
            python(),
            jobs_py().to_str().unwrap(),
            "waits",
            "2.0",
        ],
        &[("TRUTH", &truth_path)],
        T,
    );
    assert_eq!(run.status, 0, "{}", run.stderr);
    let t = truth(&truth_path);
    let v = trace(&tl);
    for e in v["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X") {
        for k in ["pid", "tid", "ts", "dur"] {
            assert!(e[k].is_number(), "{k} in {e}");
        }
    }
    let tid = |k: &str| t[k].as_u64().unwrap();
    assert_close("futex slices", slice_secs(&v, tid("futex_tid"), "futex"), secs(&t["futex_s"]), 0.05);
    assert_close("poll slices", slice_secs(&v, tid("poll_tid"), "poll"), secs(&t["poll_s"]), 0.05);
    let burner = tid("burn_tid");
    assert_close(
        "burner on-cpu + runqueue + stolen slices vs its wall time",
        slice_secs(&v, burner, "on-cpu")
            + slice_secs(&v, burner, "runqueue")
            + slice_secs(&v, burner, "stolen"),
        secs(&t["burn_wall_s"]),
        0.05,
    );
    // Each thread's slices against the summary's own numbers.
    for k in ["futex_tid", "poll_tid", "burn_tid"] {
        let th = run.thread(tid(k));
        eprintln!(
            "{k}: stolen {:.4} s in {} slices; runqueue {:.4} s in {}, summary {:.4} s",
            slice_secs(&v, tid(k), "stolen"),
            slice_count(&v, tid(k), "stolen"),
            slice_secs(&v, tid(k), "runqueue"),
            slice_count(&v, tid(k), "runqueue"),
            secs(&th["off_cpu_by_reason"]["runqueue"])
        );
        let on = slice_secs(&v, tid(k), "on-cpu");
        let want = secs(&th["on_cpu_s"]);
        // Both are the kernel's own counter; a thread's last slice ends at
        // its exit event's timestamp, and microseconds are 2 % of a thread
        // on CPU for a millisecond.
        if want > 0.05 {
            assert_close(&format!("{k} on-cpu slices vs summary"), on, want, 0.02);
        } else {
            assert!(
                (on - want).abs() < 0.001,
                "{k} on-cpu slices {on:.6} vs summary {want:.6}; {}",
                diagnosis(&run, &v, tid(k))
            );
        }
        for reason in ["futex", "poll", "runqueue"] {
            let want = secs(&th["off_cpu_by_reason"][reason]);
            let (got, n) = (slice_secs(&v, tid(k), reason), slice_count(&v, tid(k), reason));
            if reason == "runqueue" && want > 0.05 {
                // A woken thread's runqueue slice starts at its wakeup,
                // the kernel's run delay at its enqueue: 0.1-0.2 ms apart
                // at each switch measured beside a spinning CPU. (Where the
                // on-CPU counter stopped short of a switch-out, the time
                // until it is `stolen`, in neither.)
                assert!(
                    (got - want).abs() <= 0.02 * want + n as f64 * 0.0005,
                    "{k} runqueue slices {got:.4} s in {n} vs summary {want:.4} s"
                );
            } else if want > 0.05 {
                assert_close(&format!("{k} {reason} slices vs summary"), got, want, 0.02);
            }
        }
    }
    assert_eq!(v["metadata"]["capped_at_us"], Value::Null);
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.starts_with("<svg") && picture.contains("futexer") && picture.contains("burner"),
        "{picture}"
    );
}

/// A process's file reads appear with their paths (a reader forked after
/// 1.5 s, so the GPU is sampled a few times), and a scripted GPU has its
/// counter tracks; a `.gz` name gives gzip.
#[test]
fn reads_and_the_gpu_have_their_tracks() {
    require_root();
    let s = Scratch::new("timeline-gpu");
    let data = s.file("shard.bin", 3_000_017);
    let truth_path = s.path("truth.json");
    let tl = s.path("trace.json.gz");
    let gpu = ScriptedGpu::new(&json!({"devices": [{"name": "Scripted H200", "power_limit_mw": 700_000,
        "phases": [{"util_pct": 40, "power_mw": 300_000}]}]}));
    let mut c = gpu.command("run");
    c.args(["-q", "--timeline", tl.to_str().unwrap(), "--", python(), jobs_py().to_str().unwrap()])
        .args(["idle-then-read", data.to_str().unwrap(), "1.5"])
        .env("TRUTH", &truth_path);
    let out = run_with_timeout(c, T);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let gz = std::fs::read(&tl).unwrap();
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "gzip");
    let text =
        String::from_utf8(std::process::Command::new("gzip").arg("-dc").arg(&tl).output().unwrap().stdout)
            .unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let reads: Vec<&Value> = ev.iter().filter(|e| e["cat"] == "reads").collect();
    assert!(
        reads.iter().any(|e| e["args"]["files"].as_object().unwrap().contains_key(data.to_str().unwrap())),
        "no read slice names {}: {reads:?}",
        data.display()
    );
    let total: u64 = reads.iter().filter_map(|e| e["args"]["files"][data.to_str().unwrap()].as_u64()).sum();
    assert_eq!(total, 3_000_017, "the file's bytes over the read slices");
    assert!(ev.iter().any(|e| e["ph"] == "C" && e["name"] == "GPU0 utilization %"), "no GPU counter track");
    assert!(ev.iter().any(|e| e["ph"] == "C" && e["name"] == "GPU0 power W"), "no GPU power track");
    assert!(ev.iter().any(|e| e["ph"] == "i" && e["name"].as_str().unwrap().starts_with("verdict: ")));
}

/// A trainer that starts slowly (1.5 s on CPU, as importing torch does),
/// then forks two DataLoader-like workers that read a file in 256 KiB
/// batches and hand them over a queue. It is started the way a pyenv shim
/// starts python: a shell that runs 17 short shell children, then execs
/// (`sh`, which the VM images have, where pyenv's shim is bash).
const LOADER_JOB: &str = r#"
import multiprocessing as mp, sys, time
t = time.time()
while time.time() - t < 1.5:
    sum(range(1000))
def worker(path, q):
    with open(path, "rb", buffering=0) as f:
        for _ in range(20):
            f.seek(0)
            while True:
                b = f.read(256 << 10)
                if not b:
                    break
                q.put(b)
                time.sleep(0.02)
    q.put(None)
q = mp.Queue()
ws = [mp.Process(target=worker, args=(sys.argv[1], q)) for _ in range(2)]
for w in ws:
    w.start()
done = 0
while done < len(ws):
    b = q.get()
    if b is None:
        done += 1
        continue
    t = time.time()
    while time.time() - t < 0.005:
        sum(range(1000))
for w in ws:
    w.join()
"#;

/// The SVG of a real DataLoader-like run: the note where there is no GPU
/// data, the verdict row and its legend, the file reads with their total,
/// process headers trainer first, the shim's 17 `sh` children on one
/// row, and the startup's mark; asked for as `--timeline out.svg`.
#[test]
fn the_svg_groups_processes_folds_helpers_and_has_its_rows() {
    require_root();
    let s = Scratch::new("timeline-svg");
    let data = s.file("shard.bin", 1 << 20);
    let script = s.path("loader.py");
    std::fs::write(&script, LOADER_JOB).unwrap();
    let svg = s.path("trace.svg");
    let shim = format!(
        "i=0; while [ $i -lt 17 ]; do sh -c 'exit 0'; i=$((i + 1)); done; exec {} {} {}",
        python(),
        script.display(),
        data.display()
    );
    // `--timeline` with a name ending in .svg: the picture, as a user would
    // expect from the name alone.
    let run =
        stall(&["run", "--gpu", "off", "--timeline", svg.to_str().unwrap(), "--", "sh", "-c", &shim], &[], T);
    assert_eq!(run.status, 0, "{}", run.stderr);
    let p = std::fs::read_to_string(&svg).unwrap();
    let has = |what: &str| assert!(p.contains(what), "no {what:?} in the SVG:\n{p}");
    has("no GPU data (NVML not found / --gpu off)");
    has(">verdict</text>");
    has("<title>");
    has("file reads: ");
    has("MiB total, peak ");
    // The shim's children, and whatever they ran in turn, on one row.
    let shell_rows: Vec<&str> = p.lines().filter(|l| l.contains(" × sh,")).collect();
    assert_eq!(shell_rows.len(), 1, "one row for the shim's helpers:\n{p}");
    let n: u32 = shell_rows[0].split('>').nth(1).and_then(|t| t.split(' ').next()?.parse().ok()).unwrap();
    assert!(n >= 17, "{n} helpers on the row, 17 ran:\n{p}");
    let trainer = p.find("· trainer ·").unwrap_or_else(|| panic!("no trainer header:\n{p}"));
    let worker = p.find("· worker ·").unwrap_or_else(|| panic!("no worker header:\n{p}"));
    assert!(trainer < worker, "the trainer's rows come first:\n{p}");
    assert_eq!(p.matches("· worker ·").count(), 2, "a header per worker:\n{p}");
    assert!(!p.contains("· sh"), "a helper has a header of its own:\n{p}");
    assert!(run.summary()["startup_s"].is_number(), "no startup set apart: {}", run.stderr);
    has("startup ends ");
}

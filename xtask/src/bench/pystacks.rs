//! What reading Python stacks costs the job: a tight Python loop's
//! iterations per second, untraced, under `stall attach` (whose live view
//! reads stacks only for hang and input verdicts, at most every 5 s), and
//! with stacks read every second and five times a second.

use std::{
    fs,
    path::Path,
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};

use super::{parse_sample, Env, Sample, Spawned, RUN_TIMEOUT};

/// The loop: waits for `go`, then counts iterations of a little arithmetic
/// for `secs`, and writes `ops=N ns=T` to `out`.
const LOOP: &str = r#"
import os, sys, time
out, go, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
def step(x):
    return (x * 31 + 7) % 1000003
while not os.path.exists(go):
    time.sleep(0.005)
n, x, t0 = 0, 1, time.monotonic_ns()
end = t0 + int(secs * 1e9)
while True:
    for _ in range(1000):
        x = step(x)
    n += 1000
    t = time.monotonic_ns()
    if t >= end:
        break
with open(out, "w") as f:
    f.write(f"ops={n} ns={t - t0}\n")
"#;

/// How the loop is watched.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Reader {
    None,
    Stall,
    Every(f64),
}

impl Reader {
    pub const ALL: [Reader; 4] = [Reader::None, Reader::Stall, Reader::Every(1.0), Reader::Every(0.2)];

    pub fn label(self) -> String {
        match self {
            Reader::None => "untraced".into(),
            Reader::Stall => "stall attach (stacks only for hang/input verdicts)".into(),
            Reader::Every(s) => format!("stall attach, stacks read every {s} s"),
        }
    }
}

pub struct PyStacksBench {
    pub secs: f64,
    pub samples: Vec<(Reader, Sample)>,
}

pub fn run(env: &Env, runs: usize, quick: bool) -> Result<PyStacksBench> {
    let secs = if quick { 2.0 } else { 4.0 };
    let script = env.dir.join("pyloop.py");
    fs::write(&script, LOOP)?;
    let mut out = PyStacksBench { secs, samples: Vec::new() };
    for run in 0..runs {
        for k in 0..Reader::ALL.len() {
            let reader = Reader::ALL[(run + k) % Reader::ALL.len()];
            env.wait_quiet();
            let s = sample(env, &script, reader, secs).with_context(|| reader.label())?;
            println!(
                "  run {}/{runs} {:<52} {:>10.0} iterations/s",
                run + 1,
                reader.label(),
                s.ops as f64 / (s.ns as f64 / 1e9)
            );
            out.samples.push((reader, s));
        }
    }
    Ok(out)
}

fn sample(env: &Env, script: &Path, reader: Reader, secs: f64) -> Result<Sample> {
    let (res, go) = (env.dir.join("pyloop.out"), env.dir.join("pyloop.go"));
    let _ = fs::remove_file(&res);
    let _ = fs::remove_file(&go);
    let mut py = Command::new("python3");
    py.arg(script).arg(&res).arg(&go).arg(secs.to_string());
    let mut job = Spawned::start(env, py)?;
    let stall = match reader {
        Reader::None => None,
        Reader::Stall | Reader::Every(_) => {
            let mut c = Command::new(&env.stall);
            c.args(["attach", "--pid", &job.child.id().to_string(), "--gpu", "off", "-q"]);
            c.args(["--duration", &(secs + 3.0).to_string()]);
            if let Reader::Every(every) = reader {
                c.args(["--interval", &every.to_string(), "--python-stacks-every", &every.to_string()]);
            }
            Some(Spawned::start(env, c)?)
        }
    };
    // Attached (and its first stacks read) before the loop starts.
    thread::sleep(Duration::from_millis(if stall.is_some() { 1500 } else { 100 }));
    fs::write(&go, "")?;
    let t0 = Instant::now();
    job.wait(RUN_TIMEOUT)?;
    ensure!(t0.elapsed() < RUN_TIMEOUT, "the loop ran past its time");
    if let Some(mut s) = stall {
        s.wait(Duration::from_secs(30))?;
    }
    parse_sample(&res)
}

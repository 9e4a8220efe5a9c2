//! Where the traced job's time goes: per-program run counts and in-program
//! time of stall's BPF programs (kernel run-time statistics, enabled by
//! `bench-wl bpf-prof` for its measuring span only) while stall is attached
//! to a workload.
use std::{
    fs,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context, Result};

use super::{kv, parse_sample, strs, Env, Files, Mode, Spawned, RUN_TIMEOUT};

pub struct ProgCost {
    pub name: String,
    pub runs: u64,
    pub ns: u64,
}

pub struct Profile {
    pub label: &'static str,
    /// What one op is.
    pub unit: &'static str,
    pub floor: bool,
    pub secs: f64,
    /// Ops/s of the job whose programs are counted (the traced one, or the
    /// untraced neighbour in the neighbour profile).
    pub ops_per_s: f64,
    pub progs: Vec<ProgCost>,
    /// Measured on the `--before` build.
    pub before: bool,
}

impl Profile {
    pub fn ops(&self) -> f64 {
        self.ops_per_s * self.secs
    }
    pub fn total_ns(&self) -> u64 {
        self.progs.iter().map(|p| p.ns).sum()
    }
}

struct Plan {
    label: &'static str,
    unit: &'static str,
    floor: bool,
    /// Traced job (`bench-wl` args, without stop/out).
    traced: Vec<String>,
    /// An untraced job beside it, whose ops are the ones counted.
    beside: Option<Vec<String>>,
}

pub fn run(env: &Env, files: &Files, secs: f64) -> Result<Vec<Profile>> {
    let small = files.small.display().to_string();
    let pread = strs(&["pread", "--file", &small]);
    let plan = vec![
        Plan {
            label: "pread-4k: 4 KiB reads, traced",
            unit: "read",
            floor: false,
            traced: pread.clone(),
            beside: None,
        },
        Plan {
            label: "pread-4k: 4 KiB reads, traced, floor",
            unit: "read",
            floor: true,
            traced: pread.clone(),
            beside: None,
        },
        Plan {
            label: "copy-4k: 4 KiB read + 4 KiB write per block, traced",
            unit: "block",
            floor: false,
            traced: [pread.clone(), strs(&["--copy-to", &files.copy_to.display().to_string()])].concat(),
            beside: None,
        },
        Plan {
            label: "futex-pingpong: futex ping-pong, traced",
            unit: "switch",
            floor: false,
            traced: strs(&["futex", "--cpu", "1"]),
            beside: None,
        },
        Plan {
            label: "fork-storm: fork storm, traced",
            unit: "fork",
            floor: false,
            traced: strs(&["fork"]),
            beside: None,
        },
        Plan {
            label: "open + 4 KiB read + close, traced",
            unit: "iteration",
            floor: false,
            traced: strs(&["openclose", "--file", &small]),
            beside: None,
        },
        Plan {
            label: "neighbour: 4 KiB reads by an untraced process (stall traces a job reading 100/s)",
            unit: "read",
            floor: false,
            traced: [pread.clone(), strs(&["--rate", "100"])].concat(),
            beside: Some(pread),
        },
    ];
    let mut builds = vec![(env.stall.as_path(), false)];
    if let Some(b) = &env.before {
        builds.push((b.stall.as_path(), true));
    }
    let mut out = Vec::new();
    for p in plan {
        // The two builds one after the other, workload by workload.
        for &(stall, before) in &builds {
            let prof = one(env, &p, secs, stall, before).with_context(|| format!("profiling {}", p.label))?;
            println!(
                "  {:<76} {:>7.0} ns of BPF programs per {} ({:.0} {}/s){}",
                prof.label,
                prof.total_ns() as f64 / prof.ops().max(1.0),
                prof.unit,
                prof.ops_per_s,
                plural(prof.unit),
                if before { " (before)" } else { "" }
            );
            out.push(prof);
        }
    }
    Ok(out)
}

/// Profiles plan `p` under the stall at `stall` (`before`: the `--before` build).
fn one(env: &Env, p: &Plan, secs: f64, stall: &Path, before: bool) -> Result<Profile> {
    env.wait_quiet();
    let stop = env.dir.join("stop");
    let _ = fs::remove_file(&stop);
    let with_stop = |args: &[String]| {
        let mut a = args.to_vec();
        a.extend(strs(&["--stop-file", &stop.display().to_string(), "--secs", "120"]));
        a
    };
    let traced_out = env.dir.join("traced.out");
    let beside_out = env.dir.join("beside.out");
    let _ = fs::remove_file(&traced_out);
    let _ = fs::remove_file(&beside_out);
    let traced = Spawned::start(env, super::wrap(env, Mode::Baseline, &with_stop(&p.traced), &traced_out))?;
    let beside = match &p.beside {
        Some(a) => Some(Spawned::start(env, super::wrap(env, Mode::Baseline, &with_stop(a), &beside_out))?),
        None => None,
    };
    let mut attach = std::process::Command::new(stall);
    attach.args(["attach", "--pid", &traced.child.id().to_string(), "--gpu", "off", "-q"]);
    if p.floor {
        attach.arg("--floor");
    }
    let mut stall = Spawned::start(env, attach)?;
    let t0 = Instant::now();
    while prog_count(stall.child.id()) < LOADED {
        ensure!(stall.child.try_wait()?.is_none(), "stall attach exited: {}", stall.stderr());
        ensure!(t0.elapsed() < Duration::from_secs(60), "stall attach did not load within 60 s");
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(500));
    let prof_out = env.dir.join("prof.out");
    let _ = fs::remove_file(&prof_out);
    let mut cmd = std::process::Command::new(&env.wl);
    cmd.args(["bpf-prof", "--pid", &stall.child.id().to_string(), "--secs", &secs.to_string(), "--out"]);
    cmd.arg(&prof_out);
    let r = super::run_timed(env, cmd, RUN_TIMEOUT);
    fs::write(&stop, "stop")?;
    let mut jobs = vec![traced];
    jobs.extend(beside);
    for mut j in jobs {
        j.wait(Duration::from_secs(60))?;
    }
    stall.wait(Duration::from_secs(30))?;
    r?;
    let counted = parse_sample(if p.beside.is_some() { &beside_out } else { &traced_out })?;
    let text = fs::read_to_string(&prof_out)?;
    Ok(Profile {
        label: p.label,
        unit: p.unit,
        floor: p.floor,
        secs: kv(&text, "secs").and_then(|v| v.parse().ok()).unwrap_or(secs),
        ops_per_s: counted.ops as f64 / (counted.ns as f64 / 1e9),
        progs: parse_progs(&text),
        before,
    })
}

/// "switch" → "switches", "read" → "reads".
pub fn plural(unit: &str) -> String {
    if unit.ends_with("ch") || unit.ends_with('s') {
        format!("{unit}es")
    } else {
        format!("{unit}s")
    }
}

/// As many programs as a `stall attach` holds once it is loaded and attached.
pub const LOADED: usize = 7;

/// BPF programs held by a process (fdinfo lines `prog_id:`).
pub fn prog_count(pid: u32) -> usize {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else { return 0 };
    dir.flatten()
        .filter(|e| fs::read_to_string(e.path()).is_ok_and(|s| s.lines().any(|l| l.starts_with("prog_id:"))))
        .count()
}

/// `prog=NAME runs=N ns=T` lines; names are the kernel's (15 characters):
/// spelled out, and exec and exit (indistinguishable) merged.
pub fn parse_progs(text: &str) -> Vec<ProgCost> {
    let mut v: Vec<ProgCost> = Vec::new();
    for line in text.lines() {
        let (Some(name), Some(runs), Some(ns)) = (
            kv(line, "prog"),
            kv(line, "runs").and_then(|x| x.parse().ok()),
            kv(line, "ns").and_then(|x| x.parse().ok()),
        ) else {
            continue;
        };
        let name = match name {
            "sched_process_e" => "sched_process_exec + _exit",
            "sched_switch_di" => "sched_switch_direct",
            // `sched_switch_queued` and `_queued_cast` share the kernel's 15 characters.
            "sched_switch_qu" => "sched_switch_queued(_cast)",
            "sched_waking_ma" => "sched_waking_marked",
            "sched_waking_ch" => "sched_waking_checked",
            n => n,
        };
        match v.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.runs += runs;
                p.ns += ns;
            }
            None => v.push(ProgCost { name: name.to_string(), runs, ns }),
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_truncated_names() {
        let t = "prog=sched_process_e runs=2 ns=100\nprog=sched_process_e runs=3 ns=50\n\
                 prog=sys_exit runs=10 ns=700\nprog=sched_switch_di runs=1 ns=9\nsecs=2.0";
        let p = parse_progs(t);
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].name.as_str(), p[0].runs, p[0].ns), ("sched_process_exec + _exit", 5, 150));
        assert_eq!(p[1].name, "sys_exit");
        assert_eq!(p[2].name, "sched_switch_direct");
    }
}

//! The same job however it was started. Each workload (tests/workloads/
//! waits.py's, and the demo's DataLoader workers) runs bare, then under
//! each launch chain users
//! put in front of their jobs: a shim that runs short-lived helpers and then
//! exec's the interpreter (what pyenv's `python3` does; the real one too,
//! where pyenv is installed), a shell script that waits for the job,
//! `timeout`, a Python parent in `subprocess.call` (as `conda run` and
//! `uv run` wait), and `make`. Every run must get the bare run's verdict,
//! naming the same thread, worker or child, with the job's own process as
//! the trainer. A pipeline (`sh -c "producer | trainer"`) names the
//! consumer the trainer and the producer its input.
//!
//! Needs root.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde_json::Value;
use stall_tests::procs::wait_until;
use stall_tests::scratch::{disk_scratch, Scratch};
use stall_tests::stall::{stall, Run};
use stall_tests::workload::{python, shards, truth, workload};

fn waits_py() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/waits.py").display().to_string()
}

/// Turns the bare job's argv into the one that starts it through a chain.
type Wrap = Box<dyn Fn(&[String]) -> Vec<String>>;

/// A way to start a command: the argv that runs `job` through it.
struct Chain {
    name: &'static str,
    argv: Wrap,
}

/// Quoted for a POSIX shell.
fn quoted(args: &[String]) -> String {
    args.iter().map(|a| format!("'{}'", a.replace('\'', r"'\''"))).collect::<Vec<_>>().join(" ")
}

fn write_executable(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    let mut perms = std::fs::metadata(path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(path, perms).unwrap();
}

/// pyenv's shim, as it behaves: its `pyenv exec` forks some twenty bash
/// helpers (each reads a file and forks subshells, then exits) before it
/// exec's the interpreter under the name `python3`.
fn shim(dir: &Path) -> PathBuf {
    let path = dir.join("python3");
    write_executable(
        &path,
        &format!(
            "#!{bash}\n\
             set -e\n\
             for i in $(seq 1 10); do\n\
             \x20   v=$({bash} -c 'read -r line < \"$1\"; x=$(echo \"$line\" | cut -c1-4); echo \"$x\"' helper \"$0\")\n\
             \x20   ( : \"$v\" )\n\
             done\n\
             exec -a python3 {python} \"$@\"\n",
            bash = bash(),
            python = python()
        ),
    );
    path
}

/// bash, wherever this system keeps it (the VMs' guests have no /bin/bash).
fn bash() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .map(|d| Path::new(d).join("bash"))
        .find(|p| p.exists())
        .expect("bash on PATH")
        .display()
        .to_string()
}

/// pyenv's own shim for `python3`, where pyenv is installed.
fn real_pyenv_shim() -> Option<PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")))?;
    let shim = root.join("shims/python3");
    shim.exists().then_some(shim)
}

/// The chains, each turning the bare job's argv (`python3 waits.py ...`)
/// into the one that starts it through the chain.
fn chains(s: &Scratch) -> Vec<Chain> {
    let dir = s.path("chains");
    std::fs::create_dir_all(&dir).unwrap();
    let shim = shim(&dir);
    let script = dir.join("run.sh");
    // Not ending in `exec "$@"`: the shell stays and waits.
    let text =
        format!("#!{}\necho \"starting $1\" >&2\n\"$@\"\nstatus=$?\necho done >&2\nexit $status\n", bash());
    write_executable(&script, &text);
    let makefile = dir.join("Makefile");
    std::fs::write(&makefile, "job:\n\t$(JOB)\n").unwrap();
    let replace_python = |with: PathBuf| {
        move |job: &[String]| {
            let mut v = vec![with.display().to_string()];
            v.extend(job[1..].iter().cloned());
            v
        }
    };
    let mut out = vec![
        Chain { name: "bare", argv: Box::new(|job: &[String]| job.to_vec()) },
        Chain { name: "a shim that execs", argv: Box::new(replace_python(shim)) },
        Chain {
            name: "bash script.sh",
            argv: Box::new(move |job: &[String]| {
                [vec![bash(), script.display().to_string()], job.to_vec()].concat()
            }),
        },
        Chain {
            name: "timeout",
            argv: Box::new(|job: &[String]| [vec!["timeout".into(), "600".into()], job.to_vec()].concat()),
        },
        Chain {
            name: "subprocess.call",
            argv: Box::new(|job: &[String]| {
                let parent = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))";
                [vec![python().to_string(), "-c".into(), parent.into()], job.to_vec()].concat()
            }),
        },
        Chain {
            name: "make",
            argv: Box::new(move |job: &[String]| {
                let mf = makefile.display().to_string();
                vec!["make".into(), "-s".into(), "-f".into(), mf, format!("JOB={}", quoted(job))]
            }),
        },
    ];
    match real_pyenv_shim() {
        Some(p) => out.push(Chain { name: "pyenv's shim", argv: Box::new(replace_python(p)) }),
        None => eprintln!("no pyenv on this machine: the shim built here stands for it"),
    }
    out
}

/// `stall run -q -- <argv>`: the run and the job's truth.
fn run(argv: &[String], truth_path: &Path) -> (Run, Value) {
    let _ = std::fs::remove_file(truth_path);
    let mut args = vec!["run", "-q", "--"];
    args.extend(argv.iter().map(String::as_str));
    let run = stall(&args, &[], Duration::from_secs(180));
    assert_eq!(run.status, 0, "stall run {argv:?} failed:\n{}", run.stderr);
    wait_until("the workload's truth", Duration::from_secs(30), || truth_path.exists());
    (run, truth(truth_path))
}

fn verdict(run: &Run) -> (String, String) {
    let v = &run.summary()["verdict"];
    (v["kind"].as_str().unwrap().to_string(), v["summary"].as_str().unwrap().to_string())
}

/// What every chain's run must show, given the job's truth: Err says what
/// is wrong.
type Check = dyn Fn(&Run, &Value) -> Result<(), String>;

/// How a chain's argv is run: the run and the job's truth.
type Runner = dyn Fn(&[String], &Path) -> (Run, Value);

/// Runs `job` (bare argv, ending in `--truth PATH`) under every chain and
/// applies `check` to each; fails listing every chain that differs.
fn under_every_chain(tag: &str, job: &[String], truth_path: &Path, check: &Check) {
    under_every_chain_run_by(tag, job, truth_path, &run, check)
}

/// [`under_every_chain`], each chain's argv run by `runner`.
fn under_every_chain_run_by(tag: &str, job: &[String], truth_path: &Path, runner: &Runner, check: &Check) {
    let s = Scratch::new(tag);
    let mut failures = Vec::new();
    for chain in chains(&s) {
        let argv = (chain.argv)(job);
        let (run, t) = runner(&argv, truth_path);
        let (kind, line) = verdict(&run);
        let trainer = t["trainer"].as_u64().unwrap();
        let role = run.process(trainer)["role"].as_str().unwrap_or("?").to_string();
        eprintln!("{tag} via {}: {kind}: {line} (the job, pid {trainer}: {role})", chain.name);
        // The live view as the job ended takes the same process for the
        // trainer as the final report.
        let last_live = run.records.iter().rev().find(|r| r["type"] == "interval");
        let live_role = last_live
            .and_then(|r| r["processes"].as_array()?.iter().find(|p| p["pid"] == trainer))
            .map_or("absent", |p| p["role"].as_str().unwrap_or("?"));
        let result = if role != "trainer" {
            Err(format!("the job (pid {trainer}) is {role}; processes: {}", roles(&run)))
        } else if live_role != "trainer" {
            Err(format!("in the last live view the job (pid {trainer}) is {live_role}"))
        } else {
            check(&run, &t)
        };
        if let Err(e) = result {
            failures.push(format!("{}: {e}\n    verdict: {kind}: {line}", chain.name));
        }
    }
    assert!(failures.is_empty(), "{tag}: chains that differ from the bare run:\n{}", failures.join("\n"));
}

fn roles(run: &Run) -> String {
    run.processes()
        .iter()
        .map(|p| {
            format!("{} {} {}", p["pid"], p["role"].as_str().unwrap_or("?"), p["comm"].as_str().unwrap_or(""))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn expect(ok: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what())
    }
}

fn job(args: &[&str], truth_path: &Path) -> Vec<String> {
    let mut v = vec![python().to_string(), waits_py()];
    v.extend(args.iter().map(|a| a.to_string()));
    v.extend(["--truth".to_string(), truth_path.display().to_string()]);
    v
}

/// A helper thread holds the GIL while the main thread logs every step:
/// trainer-host-bound naming the thread, and never a hang.
#[test]
fn a_thread_holding_the_gil_under_every_chain() {
    let s = Scratch::new("chain-gil");
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let job = job(&["gil", "--log", log.to_str().unwrap(), "--seconds", "4"], &t_path);
    under_every_chain("gil", &job, &t_path, &|run, t| {
        let hung = run.records.iter().find(|r| r["verdict"]["kind"] == "hang");
        expect(hung.is_none(), || format!("called hang while it logged: {}", hung.unwrap()["verdict"]))?;
        let (kind, line) = verdict(run);
        let metrics = t["metrics"].as_u64().unwrap();
        expect(kind == "trainer-host-bound", || "not trainer-host-bound".into())?;
        expect(line.contains(&format!("for thread {metrics} (metrics) of the trainer")), || {
            format!("the metrics thread {metrics} is not named")
        })
    });
}

/// Two threads of the job deadlock over two locks while the main thread
/// joins one of them: `hang`, live and in the final report, the two
/// threads named in the live view, and the watchdog thread that ends the
/// job (`os._exit`) never its waker.
#[test]
fn a_deadlock_between_two_threads_under_every_chain() {
    let s = Scratch::new("chain-deadlock");
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let job = job(&["deadlock", "--log", log.to_str().unwrap(), "--hang-s", "10"], &t_path);
    under_every_chain("deadlock", &job, &t_path, &|run, t| {
        let (kind, _) = verdict(run);
        expect(kind == "hang", || "the final report is no hang".into())?;
        let (prefetch, writer) = (t["prefetch"].as_u64().unwrap(), t["writer"].as_u64().unwrap());
        let named = |r: &&Value| {
            let line = r["verdict"]["summary"].as_str().unwrap_or("");
            line.contains(&format!("prefetch {prefetch} (futex"))
                && line.contains(&format!("writer {writer} (futex"))
        };
        expect(run.records.iter().any(|r| r["verdict"]["kind"] == "hang" && named(&r)), || {
            "no live hang names the two threads".into()
        })?;
        // The 10 s wait ended as the process did (the watchdog's exit):
        // nobody handed it anything.
        let wakers = &run.thread(t["trainer"].as_u64().unwrap())["woken_by"];
        let long = wakers.as_array().into_iter().flatten().find(|b| b["blocked_s"].as_f64() > Some(5.0));
        expect(long.is_none(), || format!("a waker ended the deadlock's wait: {wakers}"))
    });
}

/// Two forked workers that sleep in `__getitem__`: input-wait-bound,
/// their sleep named.
#[test]
fn workers_that_sleep_under_every_chain() {
    let s = Scratch::new("chain-sleepy");
    let t_path = s.path("truth.json");
    let job = job(&["sleepy-workers", "--items", "30", "--nap", "0.1"], &t_path);
    under_every_chain("sleepy workers", &job, &t_path, &|run, t| {
        let (kind, line) = verdict(run);
        expect(kind == "input-wait-bound", || "not input-wait-bound".into())?;
        expect(line.contains("2 workers spend") && line.contains("of their time asleep"), || {
            "the 2 sleeping workers are not named".into()
        })?;
        for w in t["workers"].as_array().unwrap() {
            let role = run.process(w.as_u64().unwrap())["role"].clone();
            expect(role == "worker", || format!("worker {w} is {role}"))?;
        }
        Ok(())
    });
}

/// The trainer waits for an evaluation subprocess every few steps:
/// trainer-host-bound naming the evaluation.
#[test]
fn an_evaluation_subprocess_under_every_chain() {
    let s = Scratch::new("chain-eval");
    let t_path = s.path("truth.json");
    let job =
        job(&["eval-child", "--steps", "12", "--every", "4", "--step-ms", "50", "--eval-s", "1"], &t_path);
    under_every_chain("eval child", &job, &t_path, &|run, t| {
        let (kind, line) = verdict(run);
        expect(kind == "trainer-host-bound", || "not trainer-host-bound".into())?;
        let named = t["children"].as_array().unwrap().iter().any(|c| line.contains(&format!("pid {c} (")));
        expect(named, || format!("no evaluation of {} named", t["children"]))?;
        // Its three evaluations, not what a shim forked before the job.
        expect(line.contains("waiting for its 3 children, one after another"), || {
            "not its 3 evaluations".into()
        })
    });
}

/// Four loader threads of the trainer read throttled storage:
/// input-io-bound, the threads and their bytes named.
#[test]
fn loader_threads_on_slow_storage_under_every_chain() {
    let s = disk_scratch("chain-loader-threads");
    let cache = s.path("shards");
    shards(&cache, 8, 8, 16);
    let t_path = s.path("truth.json");
    let job =
        job(&["loader-threads", "--dir", cache.to_str().unwrap(), "--files", "8", "--mbps", "16"], &t_path);
    under_every_chain("loader threads", &job, &t_path, &|run, _| {
        let (kind, line) = verdict(run);
        expect(kind == "input-io-bound", || "not input-io-bound".into())?;
        expect(line.contains("4 loader threads of the trainer read 64.0 MB at"), || {
            "the loader threads' 64 MB are not named".into()
        })
    });
}

/// `sh -c "producer | trainer"`: a preprocessor on CPU pipes records to
/// the trainer. The consumer is the trainer, the producer its input,
/// named on CPU; the shell is neither. Run bare and through the shim for
/// both sides.
#[test]
fn a_pipeline_names_the_consumer_the_trainer_and_the_producer_its_input() {
    let s = Scratch::new("chain-pipeline");
    let dir = s.path("chains");
    std::fs::create_dir_all(&dir).unwrap();
    let shim = shim(&dir);
    let (p_truth, t_truth, log) = (s.path("producer.json"), s.path("truth.json"), s.path("train.log"));
    for interpreter in [python().to_string(), shim.display().to_string()] {
        for f in [&p_truth, &t_truth] {
            let _ = std::fs::remove_file(f);
        }
        let producer = [interpreter.clone(), waits_py(), "produce".into(), "--records".into(), "120".into()];
        let producer = [&producer[..], &["--truth".to_string(), p_truth.display().to_string()]].concat();
        let consumer = [
            interpreter.clone(),
            waits_py(),
            "consume".into(),
            "--log".into(),
            log.display().to_string(),
            "--truth".into(),
            t_truth.display().to_string(),
        ];
        let pipeline = format!("{} | {}", quoted(&producer), quoted(&consumer));
        let argv = vec!["sh".to_string(), "-c".into(), pipeline];
        let (run, t) = run(&argv, &t_truth);
        wait_until("the producer's truth", Duration::from_secs(30), || p_truth.exists());
        let p = truth(&p_truth);
        let (kind, line) = verdict(&run);
        let (trainer, producer) = (t["trainer"].as_u64().unwrap(), p["producer"].as_u64().unwrap());
        eprintln!("pipeline via {interpreter}: {kind}: {line}; processes {}", roles(&run));
        assert_eq!(t["bytes"], p["bytes"], "the trainer took every record");
        assert_eq!(run.process(trainer)["role"], "trainer", "{}", roles(&run));
        assert_eq!(run.process(producer)["role"], "worker", "{}", roles(&run));
        assert_eq!(kind, "input-cpu-bound", "{line}");
        assert!(line.contains("on CPU"), "{line}");
    }
}

/// A stand-in for `tini` or `dumb-init` as a container's first process:
/// it starts its command, then waits for SIGCHLD in `sigtimedwait` and
/// reaps, as they do, and exits with the command's status.
const INIT: &str = r#"
import os, signal, sys
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
child = os.fork()
if child == 0:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
    os.execvp(sys.argv[1], sys.argv[1:])
while True:
    signal.sigtimedwait([signal.SIGCHLD], 1.0)
    pid, status = os.waitpid(-1, os.WNOHANG)
    if pid == child:
        sys.exit(os.waitstatus_to_exitcode(status))
"#;

/// Kills every task of a cgroup when dropped.
struct EndsTasks(PathBuf);

impl Drop for EndsTasks {
    fn drop(&mut self) {
        let procs = std::fs::read_to_string(self.0.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// The pid of the process in `cgroup` that runs the script `script` (its
/// second argument; the init and the shell carry it further on).
fn pid_in(cgroup: &Path, script: &str) -> Option<u32> {
    let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).ok()?;
    procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()).find(|pid| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| c.split(|b| *b == 0).nth(1).is_some_and(|a| a.ends_with(script.as_bytes())))
    })
}

/// A pod as clusters run one: an init (`tini`) starts an entrypoint
/// script (which does not exec), which runs the job. Under the daemon, on
/// an idle scripted GPU the job holds, the job gets the bare run's verdict
/// — its helper thread holding the GIL, named by its thread id — with the
/// job's process as the trainer and the init and the shell as neither.
#[test]
fn a_pod_run_through_an_init_and_an_entrypoint_gets_the_bare_verdict() {
    use stall_tests::{
        cgroup::Cgroup,
        gpu::ScriptedGpu,
        http::{free_port, http_get},
        procs::Killer,
    };
    let s = Scratch::new("chain-pod");
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let entry = s.path("entrypoint.sh");
    write_executable(&entry, &format!("#!{}\necho starting >&2\n\"$@\"\necho done >&2\n", bash()));
    let gpu = ScriptedGpu::new(&serde_json::json!(null));
    let pid_file = gpu.path("trainer.pid");
    gpu.update(&serde_json::json!({"devices": [{"name": "Scripted H200", "power_limit_mw": 700_000,
        "phases": [{"util_pct": 0, "power_mw": 60_000,
                    "processes": [{"pid_file": pid_file, "used_mem_bytes": 1_000_000_000u64}]}]}]}));
    let root = Cgroup::new("chain-pod");
    let pod = root.child("pod");
    // Whatever the pod still runs (the init's orphans too) ends with the test.
    let _ends = EndsTasks(pod.dir.clone());
    let port = free_port();
    let mut daemon = gpu.command("daemon");
    daemon
        .args(["--cgroup-root", &root.name, "--interval", "1", "--escalate-idle", "2"])
        .args(["--listen", &format!("127.0.0.1:{port}")]);
    let mut guard = Killer(vec![daemon.spawn().unwrap()]);
    wait_until("the daemon's /metrics", Duration::from_secs(30), || http_get(port, "/metrics").is_some());
    let job = job(&["gil", "--log", log.to_str().unwrap(), "--seconds", "20"], &t_path);
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(r#"echo $$ > "$0" && exec "$@""#)
        .arg(pod.dir.join("cgroup.procs"))
        .args([python(), "-c", INIT, &bash(), entry.to_str().unwrap()])
        .args(&job);
    let pod_init = cmd.spawn().expect("the pod's init");
    let init_pid = pod_init.id();
    guard.0.push(pod_init);
    let mut trainer = None;
    wait_until("the job in the pod", Duration::from_secs(20), || {
        trainer = pid_in(&pod.dir, "waits.py");
        trainer.is_some()
    });
    let trainer = u64::from(trainer.unwrap());
    std::fs::write(&pid_file, trainer.to_string()).unwrap();
    let mut seen = None;
    wait_until("the daemon's verdict on the pod", Duration::from_secs(40), || {
        let Some(v) = http_get(port, "/jobs").and_then(|t| serde_json::from_str::<Value>(&t).ok()) else {
            return false;
        };
        let Some(j) = v["jobs"].as_array().and_then(|a| a.first()).cloned() else { return false };
        let done = j["tier"] == "full" && j["verdict"]["kind"] == "trainer-host-bound";
        seen = Some(j);
        done
    });
    let j = seen.unwrap();
    let role = |pid: u64| {
        j["processes"].as_array().unwrap().iter().find(|p| p["pid"] == pid).map(|p| p["role"].clone())
    };
    assert_eq!(role(trainer), Some(Value::from("trainer")), "{j:#}");
    assert_eq!(role(u64::from(init_pid)), Some(Value::from("other")), "{j:#}");
    let line = j["verdict"]["summary"].as_str().unwrap();
    // Without --expose-details the thread's name is hidden, its id is not.
    wait_until("the truth", Duration::from_secs(40), || t_path.exists());
    let metrics = truth(&t_path)["metrics"].as_u64().unwrap();
    assert!(line.contains(&format!("for thread {metrics} (")), "{line}");
}

/// A job its shell starts only after a helper ran (`sh -c "sleep 2;
/// python3 job.py"`): while the helper runs it stands for the job; once
/// the job runs, the report and the JSON say when the trainer changed and
/// why, and the final verdict is the bare run's.
#[test]
fn the_report_says_when_the_trainer_changed_and_why() {
    let s = Scratch::new("chain-role-change");
    let t_path = s.path("truth.json");
    let log = s.path("train.log");
    let job = job(&["gil", "--log", log.to_str().unwrap(), "--seconds", "4"], &t_path);
    let argv = vec!["sh".to_string(), "-c".into(), format!("sleep 2; {}", quoted(&job))];
    let (run, t) = run(&argv, &t_path);
    let trainer = t["trainer"].as_u64().unwrap();
    let changes = run.summary()["role_changes"].as_array().cloned().unwrap_or_default();
    eprintln!("role changes: {changes:?}");
    let to_job =
        changes.iter().find(|c| c["to"] == serde_json::json!([trainer])).expect("a change to the job");
    let says = to_job["says"].as_str().unwrap();
    assert!(says.contains(&format!("the trainer now: pid {trainer} (")), "{says}");
    assert!(says.contains(" ended; "), "the helper's end is not said: {says}");
    let at = to_job["at_s"].as_f64().unwrap();
    assert!((1.5..=8.0).contains(&at), "changed at {at} s");
    assert!(run.stdout.contains("Roles at ") && run.stdout.contains(says), "{}", run.stdout);
    assert_eq!(verdict(&run).0, "trainer-host-bound");
}

/// DataLoader-style worker processes (the demo's, 4) read 8 shards of 8 MB
/// from storage throttled to 16 MB/s: input-io-bound, the 4 workers named
/// as workers.
#[test]
fn dataloader_workers_on_slow_storage_under_every_chain() {
    let s = disk_scratch("chain-workers");
    let cache = s.path("shards");
    let t_path = s.path("truth.json");
    let mut args = shards(&cache, 8, 8, 16);
    args.extend(
        ["--workers", "4", "--start-delay", "0", "--truth", t_path.to_str().unwrap()].map(String::from),
    );
    let job = workload(&args);
    under_every_chain("dataloader workers", &job, &t_path, &|run, t| {
        let (kind, line) = verdict(run);
        expect(kind == "input-io-bound", || "not input-io-bound".into())?;
        expect(line.contains("4 workers"), || "the 4 workers are not named".into())?;
        for w in t["workers"].as_array().unwrap() {
            let pid = w["pid"].as_u64().unwrap();
            let role = run.process(pid)["role"].clone();
            expect(role == "worker", || format!("worker {pid} is {role}"))?;
        }
        Ok(())
    });
}

/// A reader outside the job, draining stdin at `kbps`, killed when
/// dropped.
struct SlowReader(std::process::Child);

impl Drop for SlowReader {
    fn drop(&mut self) {
        stall_tests::procs::stop(&mut self.0, nix::sys::signal::Signal::SIGKILL);
    }
}

/// `stall run` with its (and so the job's) stdout a pipe that a reader
/// outside the job drains at 1.6 MB/s; the truth gains `reader`, its pid.
fn run_into_a_slow_reader(argv: &[String], truth_path: &Path) -> (Run, Value) {
    let r_truth = truth_path.with_extension("reader.json");
    let _ = std::fs::remove_file(&r_truth);
    let mut reader = std::process::Command::new(python());
    reader
        .args([waits_py().as_str(), "slow-reader", "--kbps", "1600", "--truth", r_truth.to_str().unwrap()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null());
    let mut reader = SlowReader(reader.spawn().expect("the slow reader"));
    let into_reader = std::process::Stdio::from(reader.0.stdin.take().unwrap());
    wait_until("the reader's truth", Duration::from_secs(30), || r_truth.exists());
    let _ = std::fs::remove_file(truth_path);
    let mut args = vec!["run", "-q", "--"];
    args.extend(argv.iter().map(String::as_str));
    let run = stall_tests::stall::stall_with_stdout(&args, &[], Duration::from_secs(180), Some(into_reader));
    assert_eq!(run.status, 0, "stall run {argv:?} failed:\n{}", run.stderr);
    wait_until("the workload's truth", Duration::from_secs(30), || truth_path.exists());
    let mut t = truth(truth_path);
    t["reader"] = truth(&r_truth)["reader"].clone();
    (run, t)
}

/// The job prints 64 KiB per step into a pipe a reader outside the job
/// drains at 1.6 MB/s: output-io-bound, blocked writing stdout, the
/// reader named, whatever waits between the job and the pipe.
#[test]
fn stdout_into_a_slow_reader_under_every_chain() {
    let s = Scratch::new("chain-pipe");
    let t_path = s.path("truth.json");
    let job = job(&["pipe-writer", "--steps", "64"], &t_path);
    under_every_chain_run_by(
        "stdout into a slow reader",
        &job,
        &t_path,
        &run_into_a_slow_reader,
        &|run, t| {
            let (kind, line) = verdict(run);
            expect(kind == "output-io-bound", || "not output-io-bound".into())?;
            let r = t["reader"].as_u64().unwrap();
            expect(line.contains(&format!("writing stdout, a pipe read by pid {r} (")), || {
                format!("the reader {r} is not named")
            })
        },
    );
}

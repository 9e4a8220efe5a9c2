//! Exact scheduling accounting under stress: CPU hogs on every CPU, a second
//! stall attached to another process, and a loop of BPF map syscalls (each
//! holds `bpf_prog_active` on its CPU, which makes the kernel skip
//! perf-event tracepoint programs). stall's scheduler hooks are raw
//! tracepoints and its totals the kernel's own, so the ground-truth
//! workload still comes out exact, three runs in a row, with no switch lost.
use std::{
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use stall_tests::assert::{assert_close, assert_futex_wait, assert_thread_total};
use stall_tests::kernel::schedstat_tolerance;
use stall_tests::procs::wait_until;
use stall_tests::scratch::Scratch;
use stall_tests::stall::{bpf_programs_of, require_root, stall, stall_bin, STALL_PROGRAMS};
use stall_tests::workload::{blocked_s, jobs_py, python, secs, truth};

const T: Duration = Duration::from_secs(120);
const ROUNDS: usize = 3;

/// Background load, stopped (threads joined, children killed by their own
/// PIDs) when dropped, even when an assertion fails.
struct Stress {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    lookups: Arc<AtomicU64>,
    children: Vec<Child>,
}

impl Drop for Stress {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for c in &mut self.children {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::SIGINT);
        }
        for c in &mut self.children {
            let _ = c.wait();
        }
    }
}

/// `bpf(cmd, attr)`; attr is a zeroed `union bpf_attr` (128 bytes: the
/// kernel accepts a larger one whose tail is zero).
fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> libc::c_long {
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) }
}

/// A one-entry array map of our own, looked up in a tight loop until
/// `stop`: every lookup runs with `bpf_prog_active` held on its CPU.
fn map_lookups(stop: Arc<AtomicBool>, count: Arc<AtomicU64>) -> JoinHandle<()> {
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
    const BPF_MAP_TYPE_ARRAY: u64 = 2;
    // Kernels before 5.11 charge a map to its creator's RLIMIT_MEMLOCK,
    // against all that root has locked: the stalls of the tests before
    // (their maps freed by deferred work) can leave less than one page.
    // Raised as stall raises its own; where refused, the host charges none.
    let _ = nix::sys::resource::setrlimit(
        nix::sys::resource::Resource::RLIMIT_MEMLOCK,
        libc::RLIM_INFINITY,
        libc::RLIM_INFINITY,
    );
    let mut create = [0u64; 16];
    // map_type, key_size | value_size, max_entries
    create[0] = BPF_MAP_TYPE_ARRAY | (4 << 32);
    create[1] = 8 | (1 << 32);
    let fd = bpf(BPF_MAP_CREATE, &mut create);
    assert!(fd >= 0, "BPF_MAP_CREATE failed: {}", std::io::Error::last_os_error());
    std::thread::spawn(move || {
        let key = 0u32;
        let mut value = 0u64;
        let mut lookup = [0u64; 16];
        lookup[0] = fd as u64;
        lookup[1] = &key as *const u32 as u64;
        lookup[2] = &mut value as *mut u64 as u64;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            assert_eq!(bpf(BPF_MAP_LOOKUP_ELEM, &mut lookup.clone()), 0, "BPF_MAP_LOOKUP_ELEM failed");
            n += 1;
            if n.is_multiple_of(1024) {
                count.store(n, Ordering::Relaxed);
            }
        }
        count.store(n, Ordering::Relaxed);
        unsafe { libc::close(fd as i32) };
    })
}

fn start_stress() -> Stress {
    let stop = Arc::new(AtomicBool::new(false));
    let lookups = Arc::new(AtomicU64::new(0));
    let mut s =
        Stress { stop: stop.clone(), threads: Vec::new(), lookups: lookups.clone(), children: Vec::new() };
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    for _ in 0..cpus {
        let stop = stop.clone();
        s.threads.push(std::thread::spawn(move || {
            let mut x = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for i in 0..10_000u64 {
                    x = std::hint::black_box(x.wrapping_add(i));
                }
            }
        }));
    }
    s.threads.push(map_lookups(stop, lookups));
    // Another stall, on another process: its programs run on the same
    // tracepoints (and its map reads are bpf() syscalls too).
    let target = Command::new("sleep").arg("600").spawn().expect("sleep");
    let target_pid = target.id();
    s.children.push(target);
    let other = Command::new(stall_bin())
        .args(["attach", "--gpu", "off", "-q", "--pid", &target_pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("second stall");
    let other_pid = other.id();
    s.children.insert(0, other);
    wait_until("the second stall's programs", Duration::from_secs(60), || {
        bpf_programs_of(other_pid).len() >= STALL_PROGRAMS
    });
    s
}

#[test]
fn exact_under_cpu_hogs_bpf_syscalls_and_a_second_stall() {
    require_root();
    let stress = start_stress();
    let s = Scratch::new("stress");
    let truth_path = s.path("truth.json");
    for round in 1..=ROUNDS {
        let before = stress.lookups.load(Ordering::Relaxed);
        let run = stall(
            &["run", "-q", "--", python(), jobs_py().to_str().unwrap(), "waits", "2.0"],
            &[("TRUTH", &truth_path)],
            T,
        );
        assert_eq!(run.status, 0, "round {round}: {}", run.stderr);
        let t = truth(&truth_path);
        let sum = run.summary();
        let thread = |key: &str| run.thread(t[key].as_u64().unwrap());
        let futex = secs(&thread("futex_tid")["off_cpu_by_reason"]["futex"]);
        let poll = secs(&thread("poll_tid")["off_cpu_by_reason"]["poll"]);
        let burner = thread("burn_tid");
        let on = secs(&burner["on_cpu_s"]);
        let runq = secs(&burner["off_cpu_by_reason"]["runqueue"]);
        eprintln!(
            "round {round}: futex {futex:.4}/{:.4} (wall {:.4}) poll {poll:.4}/{:.4} (wall {:.4}) burner on-CPU {on:.4} (thread time {:.4}, \
             schedstat {:.4}) + runqueue {runq:.4} (schedstat {:.4}) vs wall {:.4}, {:.4} after the reads; sched_gaps {} repaired {}; \
             {} map lookups meanwhile",
            blocked_s(&t, "futex"),
            secs(&t["futex_s"]),
            blocked_s(&t, "poll"),
            secs(&t["poll_s"]),
            secs(&t["burn_cpu_s"]),
            secs(&t["burn_sched_s"]),
            secs(&t["burn_runq_s"]),
            secs(&t["burn_wall_s"]),
            secs(&t["burn_tail_s"]),
            sum["sched_gaps"],
            sum["sched_repaired"],
            stress.lookups.load(Ordering::Relaxed) - before,
        );
        assert_eq!(sum["sched_gaps"], 0, "round {round}: no switch may be lost");
        assert_eq!(sum["lost_events"], 0, "round {round}: {}", sum["lost_by_cause"]);
        assert_futex_wait(&format!("round {round}: futex off-CPU"), futex, &t, 0.05);
        assert_close(&format!("round {round}: poll off-CPU"), poll, blocked_s(&t, "poll"), 0.05);
        // Whole-thread figures on both sides, not the loop's: with every CPU
        // busy the burner also waits for one after its loop. Its CPU time
        // and schedstat are read before it ends; stall counts it to its end,
        // so each total may exceed that read by what the thread lived on
        // after it (0.11 s of 2 s in a VM beside another).
        let tail = secs(&t["burn_tail_s"]);
        assert_thread_total(
            &format!("round {round}: burner on-CPU vs thread time"),
            on,
            secs(&t["burn_cpu_s"]),
            tail,
            0.05,
        );
        assert_thread_total(
            &format!("round {round}: burner on-CPU vs schedstat"),
            on,
            secs(&t["burn_sched_s"]),
            tail,
            schedstat_tolerance(),
        );
        assert_thread_total(
            &format!("round {round}: burner runqueue vs schedstat"),
            runq,
            secs(&t["burn_runq_s"]),
            tail,
            0.05,
        );
        assert_thread_total(
            &format!("round {round}: burner on-CPU + runqueue vs schedstat"),
            on + runq,
            secs(&t["burn_sched_s"]) + secs(&t["burn_runq_s"]),
            tail,
            schedstat_tolerance(),
        );
        assert!(
            stress.lookups.load(Ordering::Relaxed) > before,
            "round {round}: the map syscalls ran meanwhile"
        );
    }
}

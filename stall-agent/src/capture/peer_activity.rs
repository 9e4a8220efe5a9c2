//! What the processes at the other end of the job's waits did lately (a
//! server it asks, a program that writes the pipe it reads): their CPU
//! time and storage reads, from their own counters in /proc, sampled at
//! most once a second each and only while the job waits on them.
use std::{
    collections::{HashMap, VecDeque},
    fs,
    time::{Duration, Instant},
};

use super::procfs;
use crate::wait::{Activity, WaitObject};

/// The samples kept per process: the span its activity is told over.
const SPAN: Duration = Duration::from_secs(30);
/// At most one sample per process this often.
const EVERY: Duration = Duration::from_secs(1);
/// A process not asked about this long is forgotten.
const FORGET: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    cpu_ns: u64,
    storage_read_bytes: u64,
}

#[derive(Default)]
pub struct PeerActivity {
    /// By PID: when it started (a PID reused is another process), and
    /// its samples, oldest first.
    seen: HashMap<u32, (u64, VecDeque<Sample>)>,
}

impl PeerActivity {
    /// Gives the processes at the other end of `o` (a pipe's or socket's)
    /// what they did over their last samples, sampling them now where due.
    pub fn fill(&mut self, o: &mut WaitObject) {
        let now = Instant::now();
        self.seen.retain(|_, (_, s)| s.back().is_some_and(|l| now.duration_since(l.at) < FORGET));
        let parties = match o {
            WaitObject::Pipe { others, .. } | WaitObject::Socket { others, .. } => others,
            _ => return,
        };
        for p in parties.iter_mut() {
            p.activity = self.observe(p.pid, now);
        }
    }

    fn observe(&mut self, pid: u32, now: Instant) -> Option<Activity> {
        let due =
            self.seen.get(&pid).and_then(|(_, s)| s.back()).is_none_or(|l| now.duration_since(l.at) >= EVERY);
        if due {
            let (start, sample) = sample(pid, now)?;
            let (started, samples) = self.seen.entry(pid).or_insert_with(|| (start, VecDeque::new()));
            if *started != start {
                *started = start;
                samples.clear();
            }
            samples.push_back(sample);
            while samples.len() > 2 && samples.front().is_some_and(|f| now.duration_since(f.at) > SPAN) {
                samples.pop_front();
            }
        }
        let samples = &self.seen.get(&pid)?.1;
        let (first, last) = (samples.front()?, samples.back()?);
        let span_ns = last.at.duration_since(first.at).as_nanos() as u64;
        (span_ns > 0).then(|| Activity {
            span_ns,
            cpu_ns: last.cpu_ns.saturating_sub(first.cpu_ns),
            storage_read_bytes: last.storage_read_bytes.saturating_sub(first.storage_read_bytes),
        })
    }
}

/// A process's start time and its counters now.
fn sample(pid: u32, at: Instant) -> Option<(u64, Sample)> {
    let stat = procfs::stat(pid)?;
    let io = fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    let storage_read_bytes =
        io.lines().find_map(|l| l.strip_prefix("read_bytes:")?.trim().parse().ok()).unwrap_or(0);
    Some((stat.start_ticks, Sample { at, cpu_ns: procfs::ticks_to_ns(stat.cpu_ticks), storage_read_bytes }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wait::Party;

    #[test]
    fn a_busy_process_is_seen_busy_over_its_samples() {
        let mut watch = PeerActivity::default();
        let me = std::process::id();
        let mut o = WaitObject::Socket { fd: 3, peer: None, others: vec![Party::new(me, "me")] };
        watch.fill(&mut o);
        assert_eq!(o.parties()[0].activity, None, "one sample is no span");
        let until = Instant::now() + Duration::from_millis(1300);
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        watch.fill(&mut o);
        let a = o.parties()[0].activity.expect("two samples a second apart");
        assert!(a.secs() >= 1.0 && a.secs() < 2.0, "{a:?}");
        assert!(a.cpu() >= 0.5, "this test spun all along: {a:?}");
        // Asked again within the second: the same samples, no new read.
        watch.fill(&mut o);
        assert_eq!(o.parties()[0].activity, Some(a));
    }
}

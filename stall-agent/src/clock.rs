//! Clocks: everything the agent records is CLOCK_MONOTONIC ns (the clock of
//! `bpf_ktime_get_ns`); NVML stamps its samples in microseconds of a clock it
//! does not name ("CPU timestamp"). On most drivers that is wall-clock
//! (CLOCK_REALTIME), but some report CLOCK_BOOTTIME-like values, so the
//! conversion picks whichever host clock the stamp is close to.

/// Reads `clock`, in ns; 0 if the kernel refuses (it does not for the
/// clocks used here).
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, exclusively borrowed timespec; clock_gettime
    // only writes to it.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(ts.tv_nsec as u64)
}

/// `clock_gettime(CLOCK_MONOTONIC)` in nanoseconds: the clock of
/// `bpf_ktime_get_ns()`.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// Unix time now, in seconds (for what people and Prometheus read).
pub fn unix_now_s() -> f64 {
    clock_ns(libc::CLOCK_REALTIME) as f64 / 1e9
}

/// The host clocks read together, to convert timestamps of other clocks to
/// CLOCK_MONOTONIC. Take a fresh one per poll: the realtime offset moves with
/// NTP steps and the boottime offset with suspends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSnapshot {
    pub mono_ns: u64,
    pub real_ns: u64,
    pub boot_ns: u64,
}

impl ClockSnapshot {
    pub fn now() -> Self {
        // Monotonic read on both sides and averaged, so the offsets are exact
        // to about half the (sub-microsecond) read time.
        let m0 = monotonic_ns();
        let real_ns = clock_ns(libc::CLOCK_REALTIME);
        let boot_ns = clock_ns(libc::CLOCK_BOOTTIME);
        let m1 = monotonic_ns();
        ClockSnapshot { mono_ns: m0 + m1.saturating_sub(m0) / 2, real_ns, boot_ns }
    }

    /// CLOCK_REALTIME microseconds (NVML's documented "CPU timestamp") to
    /// CLOCK_MONOTONIC ns: `mono = ts - (real_now - mono_now)`, clamped to
    /// `0..=mono_now` (a sample cannot postdate the snapshot).
    pub fn realtime_us_to_mono_ns(&self, ts_us: u64) -> u64 {
        shift_to_mono(ts_us, self.real_ns, self.mono_ns)
    }

    /// Like [`Self::realtime_us_to_mono_ns`] but for a microsecond stamp of an
    /// unnamed host clock (NVML samples): the reference is whichever of
    /// CLOCK_REALTIME, CLOCK_BOOTTIME or CLOCK_MONOTONIC reads nearest to the
    /// stamp now. Realtime (~1.7e15 us since 1970) and the since-boot clocks
    /// (~1e12 us) are far apart, so recent samples classify unambiguously;
    /// boottime and monotonic differ only by time spent suspended.
    pub fn nvml_us_to_mono_ns(&self, ts_us: u64) -> u64 {
        let ts_ns = i128::from(ts_us) * 1000;
        let mut reference = self.real_ns;
        for candidate in [self.boot_ns, self.mono_ns] {
            if (ts_ns - i128::from(candidate)).abs() < (ts_ns - i128::from(reference)).abs() {
                reference = candidate;
            }
        }
        shift_to_mono(ts_us, reference, self.mono_ns)
    }

    /// CLOCK_MONOTONIC ns to CLOCK_REALTIME ns (for human-readable reports).
    pub fn mono_to_realtime_ns(&self, mono_ns: u64) -> u64 {
        let real = i128::from(mono_ns) - i128::from(self.mono_ns) + i128::from(self.real_ns);
        real.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// `ts_us` of a clock reading `clock_now_ns` at the instant monotonic read
/// `mono_now_ns`, converted to monotonic ns. i128 so that no input overflows.
fn shift_to_mono(ts_us: u64, clock_now_ns: u64, mono_now_ns: u64) -> u64 {
    let ts_ns = i128::from(ts_us) * 1000;
    let mono = ts_ns - i128::from(clock_now_ns) + i128::from(mono_now_ns);
    mono.clamp(0, i128::from(mono_now_ns)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    // 2025-01-01T00:00:00Z in ns; 3 days of uptime; 10 min suspended.
    const REAL: u64 = 1_735_689_600_000_000_000;
    const MONO: u64 = 3 * 86_400 * 1_000_000_000;
    const BOOT: u64 = MONO + 600 * 1_000_000_000;

    fn snap() -> ClockSnapshot {
        ClockSnapshot { mono_ns: MONO, real_ns: REAL, boot_ns: BOOT }
    }

    #[test]
    fn realtime_to_monotonic() {
        let s = snap();
        // A sample 250.5 ms before the snapshot lands 250.5 ms before mono_now.
        let ts_us = REAL / 1000 - 250_500;
        assert_eq!(s.realtime_us_to_mono_ns(ts_us), MONO - 250_500_000);
        // Exactly now.
        assert_eq!(s.realtime_us_to_mono_ns(REAL / 1000), MONO);
        // Sub-microsecond offsets are kept: realtime now has 999 ns extra.
        let s2 = ClockSnapshot { real_ns: REAL + 999, ..s };
        assert_eq!(s2.realtime_us_to_mono_ns(REAL / 1000), MONO - 999);
        // Future stamps (clock jitter) clamp to now; pre-boot stamps to 0.
        assert_eq!(s.realtime_us_to_mono_ns(REAL / 1000 + 5_000), MONO);
        assert_eq!(s.realtime_us_to_mono_ns(1), 0);
        assert_eq!(s.realtime_us_to_mono_ns(0), 0);
        assert_eq!(s.realtime_us_to_mono_ns(u64::MAX), MONO);
        // Ordering and spacing survive the conversion.
        let a = s.realtime_us_to_mono_ns(REAL / 1000 - 2_000_000);
        let b = s.realtime_us_to_mono_ns(REAL / 1000 - 1_833_333);
        assert_eq!(b - a, 166_667_000);
    }

    #[test]
    fn nvml_stamp_clock_detection() {
        let s = snap();
        // Wall-clock stamp (documented NVML behaviour).
        assert_eq!(s.nvml_us_to_mono_ns(REAL / 1000 - 1_000), MONO - 1_000_000);
        // Boottime-like stamp: the 10 min suspend must not leak in.
        assert_eq!(s.nvml_us_to_mono_ns(BOOT / 1000 - 1_000), MONO - 1_000_000);
        // Monotonic stamp.
        assert_eq!(s.nvml_us_to_mono_ns(MONO / 1000 - 1_000), MONO - 1_000_000);
        // A stamp a minute old is still classified as realtime.
        assert_eq!(s.nvml_us_to_mono_ns(REAL / 1000 - 60_000_000), MONO - 60_000_000_000);
    }

    #[test]
    fn mono_to_realtime() {
        let s = snap();
        assert_eq!(s.mono_to_realtime_ns(MONO - 5), REAL - 5);
        assert_eq!(s.mono_to_realtime_ns(MONO + 7), REAL + 7);
    }

    #[test]
    fn live_clocks() {
        let a = monotonic_ns();
        let s = ClockSnapshot::now();
        let b = monotonic_ns();
        assert!(a > 0 && a <= s.mono_ns && s.mono_ns <= b);
        // Realtime is after 2020 on any sane test host; boottime >= monotonic.
        assert!(s.real_ns > 1_577_836_800_000_000_000);
        assert!(s.boot_ns + 1_000_000 >= s.mono_ns);
        // A wall-clock stamp of "now" converts to about now.
        let m = s.nvml_us_to_mono_ns(s.real_ns / 1000);
        assert!(s.mono_ns - m < 1_000_000, "{} vs {}", m, s.mono_ns);
    }
}

//! How numbers read in reports: bytes, rates, percentages, durations.

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1000.0 && i < UNITS.len() - 1 {
        v /= 1000.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else if v >= 100.0 {
        format!("{v:.0} {}", UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

pub fn rate(bytes_n: u64, secs: f64) -> String {
    if secs <= 0.0 {
        return "-".into();
    }
    let mbs = bytes_n as f64 / 1e6 / secs;
    if mbs >= 100.0 {
        format!("{mbs:.0} MB/s")
    } else {
        format!("{mbs:.1} MB/s")
    }
}

/// "1 process", "3 processes".
pub fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// A whole number with thousands apart: "24,310".
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn pct(frac: f64) -> String {
    format!("{:.0}%", (frac * 100.0).clamp(0.0, 100.0))
}

/// A CPU count such as a limit: "0.6", "2", "1.25".
pub fn cpus(n: f64) -> String {
    let s = format!("{n:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

pub fn secs(s: f64) -> String {
    if s >= 100.0 {
        format!("{s:.0}s")
    } else {
        format!("{s:.1}s")
    }
}

/// A short span: "201 ms", "1.5 s".
pub fn millis(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1e3)
    } else {
        format!("{s:.1} s")
    }
}

/// A span people read at a glance: "12 s", "8 min", "2.5 h".
pub fn span(s: f64) -> String {
    if s < 100.0 {
        format!("{s:.0} s")
    } else if s < 6000.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readable() {
        assert_eq!(bytes(999), "999 B");
        assert_eq!(bytes(17_000_000_000), "17.0 GB");
        assert_eq!(bytes(410_000_000), "410 MB");
        assert_eq!(rate(410_000_000, 1.0), "410 MB/s");
        assert_eq!(rate(5_000_000, 2.0), "2.5 MB/s");
        assert_eq!(pct(0.834), "83%");
        assert_eq!(secs(60.0), "60.0s");
        assert_eq!((span(12.4), span(480.0), span(9000.0)), ("12 s".into(), "8 min".into(), "2.5 h".into()));
    }
}

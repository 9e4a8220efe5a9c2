//! `--gpu off|all|0,2`.

use std::fmt;
use std::str::FromStr;

use super::GpuError;

/// Which devices to sample.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum GpuSelect {
    /// Every device NVML reports.
    #[default]
    All,
    /// No GPU sampling at all (NVML is not even loaded).
    Off,
    /// These NVML indices, sorted ascending, without duplicates.
    Indices(Vec<u32>),
}

impl FromStr for GpuSelect {
    type Err = GpuError;

    /// Accepts `off`, `all` (any case) or a comma-separated list of NVML
    /// device indices (`0`, `0,2`, `1, 3`). Duplicates are merged and the
    /// list is sorted, so snapshots come in index order.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |reason: String| GpuError::BadSelect { input: s.to_string(), reason };
        let t = s.trim();
        if t.eq_ignore_ascii_case("off") {
            return Ok(GpuSelect::Off);
        }
        if t.eq_ignore_ascii_case("all") {
            return Ok(GpuSelect::All);
        }
        if t.is_empty() {
            return Err(bad("empty".into()));
        }
        let mut indices = Vec::new();
        for part in t.split(',') {
            let p = part.trim();
            if p.is_empty() {
                return Err(bad("empty device index".into()));
            }
            // Digits only: u32::from_str would also take "+1".
            if !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(format!("{p:?} is not a device index")));
            }
            let i = p.parse::<u32>().map_err(|_| bad(format!("device index {p} is too large")))?;
            indices.push(i);
        }
        indices.sort_unstable();
        indices.dedup();
        Ok(GpuSelect::Indices(indices))
    }
}

/// Inverse of `from_str`, e.g. for a clap default value or the report header.
impl fmt::Display for GpuSelect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuSelect::All => f.write_str("all"),
            GpuSelect::Off => f.write_str("off"),
            GpuSelect::Indices(v) => {
                for (n, i) in v.iter().enumerate() {
                    if n > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{i}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<GpuSelect, GpuError> {
        s.parse()
    }

    #[test]
    fn keywords() {
        assert_eq!(parse("off").unwrap(), GpuSelect::Off);
        assert_eq!(parse("all").unwrap(), GpuSelect::All);
        assert_eq!(parse(" ALL ").unwrap(), GpuSelect::All);
        assert_eq!(parse("Off").unwrap(), GpuSelect::Off);
        assert_eq!(GpuSelect::default(), GpuSelect::All);
    }

    #[test]
    fn indices() {
        assert_eq!(parse("0,2").unwrap(), GpuSelect::Indices(vec![0, 2]));
        assert_eq!(parse("3").unwrap(), GpuSelect::Indices(vec![3]));
        assert_eq!(parse(" 2 , 0 ").unwrap(), GpuSelect::Indices(vec![0, 2]));
        assert_eq!(parse("1,1,0").unwrap(), GpuSelect::Indices(vec![0, 1]));
        assert_eq!(parse("4294967295").unwrap(), GpuSelect::Indices(vec![u32::MAX]));
    }

    #[test]
    fn bad_input_errors() {
        for s in [
            "",
            " ",
            "none",
            "gpu0",
            "0,",
            ",1",
            "0,,2",
            "-1",
            "+1",
            "1.5",
            "0;2",
            "0 2",
            "4294967296",
            "all,0",
        ] {
            let e = parse(s).expect_err(s);
            assert!(matches!(e, GpuError::BadSelect { .. }), "{s:?}: {e:?}");
            let msg = e.to_string();
            assert!(msg.starts_with("invalid --gpu value"), "{msg}");
            assert!(!msg.contains('\n'), "{msg:?}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in ["off", "all", "0", "0,2", "1,5,7"] {
            assert_eq!(parse(s).unwrap().to_string(), s);
        }
        assert_eq!(GpuSelect::Indices(vec![]).to_string(), "");
    }
}

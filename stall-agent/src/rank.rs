//! Which rank of a distributed run a process is, from the variables its
//! launcher put in its environment (torchrun, `torch.distributed` users,
//! Slurm, Open MPI, PMI). Only the variables named here are ever kept:
//! environments hold secrets. Pure.
use serde::Serialize;

/// The environment variables read, and nothing else.
pub const ENV_KEYS: [&str; 13] = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
];

/// Who set the rank: a launcher of ranks (torch) is more specific than one
/// of tasks (Slurm's `srun` task may be torchrun's agent, whose ranks then
/// carry both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    Pmi,
    Mpi,
    Slurm,
    Torch,
}

/// A process's place in a distributed run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Rank {
    /// Its global rank.
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// The run it belongs to: `TORCHELASTIC_RUN_ID`, else the rendezvous
    /// endpoint (`MASTER_ADDR:MASTER_PORT`), else the Slurm job.
    pub run_id: Option<String>,
    #[serde(skip)]
    pub source: Source,
}

impl Rank {
    /// From (name, value) pairs of an environment; names outside
    /// [`ENV_KEYS`] are ignored. None: not a rank of any run.
    pub fn from_env<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Rank> {
        let mut v: [Option<&str>; ENV_KEYS.len()] = [None; ENV_KEYS.len()];
        for (k, val) in vars {
            if let Some(i) = ENV_KEYS.iter().position(|e| *e == k) {
                v[i] = Some(val);
            }
        }
        let get = |name: &str| v[ENV_KEYS.iter().position(|e| *e == name).expect("a listed key")];
        let num = |name: &str| get(name).and_then(|s| s.trim().parse::<u32>().ok());
        let (rank, source) = [
            ("RANK", Source::Torch),
            ("SLURM_PROCID", Source::Slurm),
            ("OMPI_COMM_WORLD_RANK", Source::Mpi),
            ("PMI_RANK", Source::Pmi),
        ]
        .into_iter()
        .find_map(|(name, source)| Some((num(name)?, source)))?;
        let non_empty = |name: &str| get(name).map(str::trim).filter(|s| !s.is_empty());
        let run_id = non_empty("TORCHELASTIC_RUN_ID")
            .filter(|id| *id != "none")
            .map(str::to_string)
            .or_else(|| Some(format!("{}:{}", non_empty("MASTER_ADDR")?, non_empty("MASTER_PORT")?)))
            .or_else(|| non_empty("SLURM_JOB_ID").map(|j| format!("slurm-{j}")));
        let (local_rank, world_size) = match source {
            Source::Torch => (num("LOCAL_RANK"), num("WORLD_SIZE")),
            _ => (None, None),
        };
        Some(Rank { rank, local_rank, world_size, run_id, source })
    }

    /// From the bytes of `/proc/PID/environ` (NUL-separated `NAME=value`).
    pub fn from_environ(bytes: &[u8]) -> Option<Rank> {
        let pairs = bytes.split(|b| *b == 0).filter_map(|entry| {
            let eq = entry.iter().position(|b| *b == b'=')?;
            let name = std::str::from_utf8(&entry[..eq]).ok()?;
            // Decode only what is kept.
            if !ENV_KEYS.contains(&name) {
                return None;
            }
            Some((name, std::str::from_utf8(&entry[eq + 1..]).ok()?))
        });
        Self::from_env(pairs)
    }

    /// Whether two processes are the same rank of the same run (a
    /// DataLoader worker inherits its rank's environment).
    pub fn same_as(&self, other: &Rank) -> bool {
        self.rank == other.rank && self.run_id == other.run_id && self.source == other.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(vars: &[(&str, &str)]) -> Option<Rank> {
        Rank::from_env(vars.iter().copied())
    }

    #[test]
    fn torchrun_ranks_carry_their_run() {
        let r = rank(&[
            ("RANK", "2"),
            ("LOCAL_RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("TORCHELASTIC_RUN_ID", "job-7"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!((r.rank, r.local_rank, r.world_size, r.source), (2, Some(2), Some(4), Source::Torch));
        assert_eq!(r.run_id.as_deref(), Some("job-7"));
    }

    #[test]
    fn the_run_is_the_rendezvous_else_the_slurm_job() {
        let r = rank(&[("RANK", "0"), ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")]).unwrap();
        assert_eq!(r.run_id.as_deref(), Some("127.0.0.1:29500"));
        // torchrun without a rendezvous id says "none".
        let r = rank(&[
            ("RANK", "1"),
            ("TORCHELASTIC_RUN_ID", "none"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ]);
        assert_eq!(r.unwrap().run_id.as_deref(), Some("h:1"));
        let r = rank(&[("SLURM_PROCID", "3"), ("SLURM_JOB_ID", "4242")]).unwrap();
        assert_eq!((r.rank, r.source, r.run_id.as_deref()), (3, Source::Slurm, Some("slurm-4242")));
        assert_eq!(rank(&[("RANK", "0")]).unwrap().run_id, None);
    }

    #[test]
    fn torch_ranks_win_over_the_launchers_tasks() {
        let r = rank(&[("SLURM_PROCID", "1"), ("RANK", "9"), ("SLURM_JOB_ID", "5")]).unwrap();
        assert_eq!((r.rank, r.source), (9, Source::Torch));
        assert_eq!(rank(&[("OMPI_COMM_WORLD_RANK", "5")]).unwrap().source, Source::Mpi);
        assert_eq!(rank(&[("PMI_RANK", "6")]).unwrap().rank, 6);
    }

    #[test]
    fn no_rank_no_identity() {
        assert_eq!(rank(&[("LOCAL_RANK", "0"), ("WORLD_SIZE", "4")]), None);
        assert_eq!(rank(&[("RANK", "two")]), None);
        assert_eq!(rank(&[]), None);
    }

    #[test]
    fn only_listed_variables_are_read_from_environ() {
        let environ = b"HOME=/root\0AWS_SECRET_ACCESS_KEY=hunter2\0RANK=1\0WORLD_SIZE=2\0MASTER_ADDR=a\0MASTER_PORT=1\0";
        let r = Rank::from_environ(environ).unwrap();
        assert_eq!((r.rank, r.world_size, r.run_id.as_deref()), (1, Some(2), Some("a:1")));
        assert_eq!(Rank::from_environ(b"PATH=/bin\0\xff\xfe=1\0"), None);
    }
}

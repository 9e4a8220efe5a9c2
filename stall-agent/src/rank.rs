//! Which rank of a distributed run a process is. The sources, most
//! specific first (docs/VERDICTS.md, "Ranks"):
//! - the variables a launcher or the job itself put in its environment
//!   (torchrun, `torch.distributed` users, Slurm, Open MPI, PMI): the
//!   environment it has now, read from its memory, else the one it was
//!   exec'd with (`/proc/PID/environ`);
//! - the index `torch.multiprocessing.spawn` (or `start_processes`) gave
//!   it: the argument its wrapper was called with, else its place among
//!   the processes its launcher started, in the order they started.
//!
//! Only the variables named here are ever kept: environments hold secrets.
//! Pure.
use serde::Serialize;

/// The environment variables read, and nothing else.
pub const ENV_KEYS: [&str; 21] = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "NODE_RANK",
    "TORCHELASTIC_RUN_ID",
    "MASTER_ADDR",
    "MASTER_PORT",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_RANK",
    "PMI_SIZE",
    "PMI_LOCAL_RANK",
    "PMIX_NAMESPACE",
];

/// The longest value kept (a rendezvous host name is the longest).
pub const VALUE_MAX: usize = 256;

/// Who set the rank: a launcher of ranks (torch) is more specific than one
/// of tasks (Slurm's `srun` task may be torchrun's agent, whose ranks then
/// carry both).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The NCCL communicator the process created (its rank and size as
    /// `ncclCommInitRank` was given them): no launcher named it.
    Nccl,
    Pmi,
    Mpi,
    Slurm,
    Torch,
}

/// Where stall found the rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Found {
    /// The environment the process was exec'd with.
    #[serde(rename = "environ")]
    ExecEnviron,
    /// The environment it has now (set after start, as `os.environ[...]`
    /// does).
    #[serde(rename = "live-environ")]
    LiveEnviron,
    /// The index `torch.multiprocessing.spawn` gave it: read from its
    /// wrapper's arguments, else its place among its launcher's processes
    /// in the order they started.
    #[serde(rename = "spawn-index")]
    SpawnIndex,
    /// The NCCL communicator it created, seen by the GPU probes.
    #[serde(rename = "nccl-communicator")]
    Communicator,
}

/// A process's place in a distributed run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Rank {
    /// Its global rank.
    pub rank: u32,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    /// The run it belongs to: `TORCHELASTIC_RUN_ID`, else the rendezvous
    /// endpoint (`MASTER_ADDR:MASTER_PORT`), else the Slurm job, else the
    /// PMIx namespace.
    pub run_id: Option<String>,
    #[serde(skip)]
    pub source: Source,
    #[serde(skip)]
    pub found: Found,
}

/// The listed variables of one environment (a value of another name is
/// never held).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Env {
    values: [Option<String>; ENV_KEYS.len()],
}

/// Whether `name` is one of the variables read.
pub fn is_listed(name: &[u8]) -> bool {
    ENV_KEYS.iter().any(|k| k.as_bytes() == name)
}

impl Env {
    /// From (name, value) pairs; names outside [`ENV_KEYS`] are ignored,
    /// values cut at [`VALUE_MAX`].
    pub fn from_pairs<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> Env {
        let mut env = Env::default();
        for (k, v) in vars {
            if let Some(i) = ENV_KEYS.iter().position(|e| *e == k) {
                let mut end = v.len().min(VALUE_MAX);
                while !v.is_char_boundary(end) {
                    end -= 1;
                }
                env.values[i] = Some(v[..end].to_string());
            }
        }
        env
    }

    /// From NUL-separated `NAME=value` entries (`/proc/PID/environ`, or
    /// what [`crate::capture::environ`] read from memory).
    pub fn from_environ(bytes: &[u8]) -> Env {
        let pairs = bytes.split(|b| *b == 0).filter_map(|entry| {
            let eq = entry.iter().position(|b| *b == b'=')?;
            // Decode only what is kept.
            if !is_listed(&entry[..eq]) {
                return None;
            }
            Some((std::str::from_utf8(&entry[..eq]).ok()?, std::str::from_utf8(&entry[eq + 1..]).ok()?))
        });
        Env::from_pairs(pairs)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        let i = ENV_KEYS.iter().position(|e| *e == name)?;
        self.values[i].as_deref().map(str::trim).filter(|s| !s.is_empty())
    }

    fn num(&self, name: &str) -> Option<u32> {
        self.get(name)?.parse().ok()
    }

    pub fn is_empty(&self) -> bool {
        self.values.iter().all(Option::is_none)
    }

    /// The run these variables name, rank or not: `TORCHELASTIC_RUN_ID`,
    /// else the rendezvous endpoint, else the Slurm job, else the PMIx
    /// namespace (Open MPI's job).
    pub fn run_id(&self) -> Option<String> {
        self.get("TORCHELASTIC_RUN_ID")
            .filter(|id| *id != "none")
            .map(str::to_string)
            .or_else(|| Some(format!("{}:{}", self.get("MASTER_ADDR")?, self.get("MASTER_PORT")?)))
            .or_else(|| self.get("SLURM_JOB_ID").map(|j| format!("slurm-{j}")))
            .or_else(|| self.get("PMIX_NAMESPACE").map(str::to_string))
    }

    /// The node a launcher runs on, as multi-node scripts of
    /// `torch.multiprocessing.spawn` pass it (`NODE_RANK`, torchrun's
    /// `GROUP_RANK`).
    pub fn node_rank(&self) -> Option<u32> {
        self.num("NODE_RANK").or_else(|| self.num("GROUP_RANK"))
    }

    /// The rank these variables name (None: not a rank of any run).
    pub fn rank(&self, found: Found) -> Option<Rank> {
        let (rank, source) = [
            ("RANK", Source::Torch),
            ("SLURM_PROCID", Source::Slurm),
            ("OMPI_COMM_WORLD_RANK", Source::Mpi),
            ("PMI_RANK", Source::Pmi),
        ]
        .into_iter()
        .find_map(|(name, source)| Some((self.num(name)?, source)))?;
        let (local_rank, world_size) = match source {
            Source::Torch => (self.num("LOCAL_RANK"), self.num("WORLD_SIZE")),
            Source::Slurm => (self.num("SLURM_LOCALID"), self.num("SLURM_NTASKS")),
            Source::Mpi => (self.num("OMPI_COMM_WORLD_LOCAL_RANK"), self.num("OMPI_COMM_WORLD_SIZE")),
            Source::Pmi => (self.num("PMI_LOCAL_RANK"), self.num("PMI_SIZE")),
            Source::Nccl => (None, None),
        };
        Some(Rank { rank, local_rank, world_size, run_id: self.run_id(), source, found })
    }
}

impl Rank {
    /// A rank from the NCCL communicator a process created: its rank and
    /// size, and the unique id all its ranks share as the run.
    pub fn of_communicator(rank: u32, nranks: u32, id: u64) -> Rank {
        Rank {
            rank,
            local_rank: None,
            world_size: Some(nranks),
            run_id: Some(format!("nccl:{id:016x}")),
            source: Source::Nccl,
            found: Found::Communicator,
        }
    }

    /// From (name, value) pairs of an environment it was exec'd with.
    pub fn from_env<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Rank> {
        Env::from_pairs(vars).rank(Found::ExecEnviron)
    }

    /// Whether two processes are the same rank of the same run (a
    /// DataLoader worker inherits its rank's environment).
    pub fn same_as(&self, other: &Rank) -> bool {
        self.rank == other.rank && self.run_id == other.run_id && self.source == other.source
    }
}

/// A process multiprocessing started to run a target (by `spawn`, or
/// forked by a fork server), as [`spawn_ranks`] needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnChild {
    pub tgid: u32,
    /// Its launcher (or the launcher's fork server).
    pub ppid: u32,
    /// Sorts the launcher's children in the order they started.
    pub started: (u64, u32),
    /// Whether its Python stack runs `torch.multiprocessing.spawn`'s
    /// wrapper (None: not read yet, or still unpickling its target).
    pub torch_spawned: Option<bool>,
    /// The index the wrapper was given, where its arguments were read.
    pub index: Option<u32>,
    /// The run its environment (now, else at exec) names.
    pub run_id: Option<String>,
}

/// The ranks `torch.multiprocessing.spawn` gave: it starts process `i` of
/// `nprocs` with `_wrap(fn, i, ...)`. The index read from that call is the
/// rank; a child whose index is not known takes the lowest one not taken,
/// in the order the children started (spawn starts them one after
/// another). Children of a launcher count once any of them runs the
/// wrapper (a DataLoader's spawned workers run another target).
/// `node_rank(launcher)`: the launcher's node of a multi-node run (its
/// ranks are offset by that × nprocs).
pub fn spawn_ranks(children: &[SpawnChild], node_rank: impl Fn(u32) -> Option<u32>) -> Vec<(u32, Rank)> {
    let mut launchers: Vec<u32> =
        children.iter().filter(|c| c.torch_spawned == Some(true)).map(|c| c.ppid).collect();
    launchers.sort_unstable();
    launchers.dedup();
    let mut out = Vec::new();
    for launcher in launchers {
        let mut group: Vec<&SpawnChild> =
            children.iter().filter(|c| c.ppid == launcher && c.torch_spawned != Some(false)).collect();
        group.sort_by_key(|c| c.started);
        let taken: Vec<u32> = group.iter().filter_map(|c| c.index).collect();
        let mut free = (0u32..).filter(|i| !taken.contains(i));
        let nprocs = taken.iter().map(|i| i + 1).fold(group.len() as u32, u32::max);
        let node = node_rank(launcher);
        let run_id =
            group.iter().find_map(|c| c.run_id.clone()).unwrap_or_else(|| format!("spawn-{launcher}"));
        for c in group {
            let i = c.index.unwrap_or_else(|| free.next().expect("endless"));
            out.push((
                c.tgid,
                Rank {
                    rank: node.map_or(i, |n| n * nprocs + i),
                    local_rank: Some(i),
                    world_size: if node.is_none() { Some(nprocs) } else { None },
                    run_id: Some(run_id.clone()),
                    source: Source::Torch,
                    found: Found::SpawnIndex,
                },
            ));
        }
    }
    out
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
    fn each_launcher_names_its_local_rank_and_size() {
        let r = rank(&[("SLURM_PROCID", "5"), ("SLURM_LOCALID", "1"), ("SLURM_NTASKS", "8")]).unwrap();
        assert_eq!((r.rank, r.local_rank, r.world_size), (5, Some(1), Some(8)));
        let r = rank(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ])
        .unwrap();
        assert_eq!((r.rank, r.local_rank, r.world_size), (3, Some(3), Some(4)));
        let r = rank(&[("PMI_RANK", "2"), ("PMI_SIZE", "4")]).unwrap();
        assert_eq!((r.rank, r.world_size), (2, Some(4)));
        let r = rank(&[("OMPI_COMM_WORLD_RANK", "1"), ("PMIX_NAMESPACE", "prterun-h-7@1")]).unwrap();
        assert_eq!(r.run_id.as_deref(), Some("prterun-h-7@1"));
    }

    #[test]
    fn no_rank_no_identity() {
        assert_eq!(rank(&[("LOCAL_RANK", "0"), ("WORLD_SIZE", "4")]), None);
        assert_eq!(rank(&[("RANK", "two")]), None);
        assert_eq!(rank(&[("RANK", "")]), None);
        assert_eq!(rank(&[]), None);
    }

    #[test]
    fn only_whole_listed_names_are_decoded_from_environ() {
        // Names that merely start or end like a listed one are not it.
        let env = Env::from_environ(b"RANKS=1\0XRANK=2\0RANK\0=3\0MASTER_ADDR=a=b\0MASTER_PORT=1\0RANK=4\0");
        assert_eq!(env.rank(Found::ExecEnviron).map(|r| r.rank), Some(4));
        assert_eq!(env.get("MASTER_ADDR"), Some("a=b"));
        assert!(!is_listed(b"RANKS") && !is_listed(b"") && is_listed(b"PMI_RANK"));
        assert!(Env::from_environ(b"PATH=/bin\0\xff\xfe=1\0HOME=/root\0").is_empty());
        // A value is kept to its first VALUE_MAX bytes, on a char boundary.
        let long = "é".repeat(VALUE_MAX);
        let env = Env::from_pairs([("MASTER_ADDR", long.as_str())]);
        assert!(env.get("MASTER_ADDR").unwrap().len() <= VALUE_MAX);
    }

    #[test]
    fn the_listed_names_are_distinct() {
        let mut names = ENV_KEYS.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ENV_KEYS.len());
    }

    #[test]
    fn a_launcher_names_its_node_for_spawned_ranks() {
        assert_eq!(Env::from_pairs([("NODE_RANK", "1")]).node_rank(), Some(1));
        assert_eq!(Env::from_pairs([("GROUP_RANK", "2")]).node_rank(), Some(2));
        assert_eq!(Env::from_pairs([("RANK", "2")]).node_rank(), None);
    }

    fn child(tgid: u32, ppid: u32, started: u64, torch_spawned: Option<bool>) -> SpawnChild {
        SpawnChild { tgid, ppid, started: (started, tgid), torch_spawned, index: None, run_id: None }
    }

    #[test]
    fn an_index_read_from_the_wrapper_wins_over_the_start_order() {
        // Started in reverse (as a launcher starting its ranks in parallel
        // may): the indices read decide; one not read yet takes the index
        // left free.
        let mut kids = [
            child(100, 10, 1, Some(true)),
            child(101, 10, 2, Some(true)),
            child(102, 10, 3, None),
            child(103, 10, 4, Some(true)),
        ];
        for (k, index) in kids.iter_mut().zip([Some(3), Some(2), None, Some(0)]) {
            k.index = index;
        }
        let mut got = spawn_ranks(&kids, |_| None);
        got.sort_unstable_by_key(|(t, _)| *t);
        let ranks: Vec<(u32, u32, Option<u32>)> =
            got.iter().map(|(t, r)| (*t, r.rank, r.world_size)).collect();
        assert_eq!(ranks, [(100, 3, Some(4)), (101, 2, Some(4)), (102, 1, Some(4)), (103, 0, Some(4))]);
        // Ranks that ended before they were seen still count in the size.
        let kids = [child(100, 10, 1, Some(true)), child(101, 10, 2, Some(true))];
        let kids = kids.map(|mut k| {
            k.index = Some(k.tgid - 100 + 2);
            k
        });
        let sizes: Vec<Option<u32>> =
            spawn_ranks(&kids, |_| None).iter().map(|(_, r)| r.world_size).collect();
        assert_eq!(sizes, [Some(4), Some(4)]);
    }

    #[test]
    fn spawned_ranks_are_their_launchers_children_in_start_order() {
        // Pids out of start order (they wrapped): the start decides.
        let kids = [
            child(900, 10, 3, Some(true)),
            child(200, 10, 1, None),
            child(100, 10, 2, Some(true)),
            child(300, 10, 4, Some(true)),
        ];
        let mut got = spawn_ranks(&kids, |_| None);
        got.sort_unstable_by_key(|(t, _)| *t);
        let ranks: Vec<(u32, u32, Option<u32>)> =
            got.iter().map(|(t, r)| (*t, r.rank, r.world_size)).collect();
        assert_eq!(ranks, [(100, 1, Some(4)), (200, 0, Some(4)), (300, 3, Some(4)), (900, 2, Some(4))]);
        assert!(got.iter().all(|(_, r)| r.found == Found::SpawnIndex && r.source == Source::Torch));
        assert!(got.iter().all(|(_, r)| r.run_id.as_deref() == Some("spawn-10")));
    }

    #[test]
    fn spawned_workers_of_another_target_are_no_ranks() {
        // A DataLoader's spawned workers (children of rank 100) never run
        // the wrapper; until one child of a launcher does, none counts.
        let kids = [
            child(100, 10, 1, None),
            child(110, 100, 5, Some(false)),
            child(111, 100, 6, Some(false)),
            child(200, 20, 1, None),
        ];
        assert!(spawn_ranks(&kids, |_| None).is_empty());
    }

    #[test]
    fn a_second_node_offsets_its_spawned_ranks() {
        let mut kids = [child(100, 10, 1, Some(true)), child(101, 10, 2, Some(true))];
        kids[1].run_id = Some("10.0.0.1:29500".into());
        let got = spawn_ranks(&kids, |launcher| (launcher == 10).then_some(1));
        let ranks: Vec<(u32, Option<u32>, Option<u32>)> =
            got.iter().map(|(_, r)| (r.rank, r.local_rank, r.world_size)).collect();
        assert_eq!(ranks, [(2, Some(0), None), (3, Some(1), None)]);
        assert!(got.iter().all(|(_, r)| r.run_id.as_deref() == Some("10.0.0.1:29500")));
    }
}

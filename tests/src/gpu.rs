//! GPUs without a driver: the scripted NVML library and the stand-in CUDA
//! library, found, and a GPU script to run stall against.

use crate::{scratch::Scratch, stall::stall_bin};
use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// File name of the scripted NVML library (crate `tests/nvml-script`).
pub const NVML_SCRIPT_LIB: &str = "libstall_nvml_script.so";

/// The scripted NVML library: see [`stand_in_lib`].
pub fn nvml_script_lib() -> PathBuf {
    stand_in_lib(NVML_SCRIPT_LIB, "STALL_NVML_SCRIPT_LIB", "stall-nvml-script")
}

/// File name of the stand-in CUDA library (crate `tests/cuda-stub`).
pub const CUDA_STUB_LIB: &str = "libstall_cuda_stub.so";

/// The stand-in CUDA library the CUDA jobs load (tests/workloads/cuda_job.py
/// `--lib`): see [`stand_in_lib`].
pub fn cuda_stub_lib() -> PathBuf {
    stand_in_lib(CUDA_STUB_LIB, "STALL_CUDA_STUB_LIB", "stall-cuda-stub")
}

/// File name of the stand-in NCCL library (crate `tests/nccl-stub`).
pub const NCCL_STUB_LIB: &str = "libstall_nccl_stub.so";

/// The stand-in NCCL library the NCCL jobs load (tests/workloads/nccl_job.py
/// `--nccl-lib`): see [`stand_in_lib`].
pub fn nccl_stub_lib() -> PathBuf {
    stand_in_lib(NCCL_STUB_LIB, "STALL_NCCL_STUB_LIB", "stall-nccl-stub")
}

/// A library the tests load in place of a GPU's own (`file`, built by
/// crate `package`): $`env` (set by `cargo xtask test` and by the test
/// VMs' /init), else next to the stall binary (cargo builds both into
/// target/PROFILE), else the workspace's release or debug build.
fn stand_in_lib(file: &str, env: &str, package: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    let next_to_stall = stall_bin().with_file_name(file);
    if next_to_stall.exists() {
        return next_to_stall;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    for profile in ["release", "debug"] {
        let p = root.join("target").join(profile).join(file);
        if p.exists() {
            return p;
        }
    }
    panic!("no {file}: run `cargo build --release -p {package}` (`cargo xtask test` does) or set {env}");
}

/// GPUs for stall to sample without a driver: a script for the scripted
/// NVML library (its format: tests/nvml-script/src/lib.rs) in a scratch
/// directory of its own. Run stall with [`Self::args`] after the subcommand
/// and [`Self::env`] in its environment, or start from [`Self::command`].
pub struct ScriptedGpu {
    dir: Scratch,
    script: PathBuf,
}

impl ScriptedGpu {
    /// Writes `script` (e.g. `json!({"devices": [...]})`).
    pub fn new(script: &Value) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = Scratch::new(&format!("nvml-{}", N.fetch_add(1, Ordering::Relaxed)));
        let script_path = dir.path("nvml-script.json");
        let gpu = Self { dir, script: script_path };
        gpu.update(script);
        gpu
    }

    /// Replaces the script atomically (temp file + rename): the library
    /// picks the change up at its next call, so the GPU changes state live.
    pub fn update(&self, script: &Value) {
        let tmp = self.dir.path("nvml-script.json.tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(script).unwrap()).unwrap();
        std::fs::rename(&tmp, &self.script).unwrap();
    }

    /// The script's path (what `STALL_NVML_SCRIPT` names).
    pub fn script(&self) -> &Path {
        &self.script
    }

    /// A path in this GPU's scratch directory, e.g. for a `pid_file`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path(name)
    }

    /// stall's arguments that load the scripted library.
    pub fn args(&self) -> Vec<std::ffi::OsString> {
        vec!["--nvml-lib".into(), nvml_script_lib().into_os_string()]
    }

    /// The environment variable the library reads its script from.
    pub fn env(&self) -> (&'static str, &Path) {
        ("STALL_NVML_SCRIPT", &self.script)
    }

    /// `stall SUBCOMMAND --nvml-lib LIB` with the script in its environment;
    /// add the rest of the arguments.
    pub fn command(&self, subcommand: &str) -> Command {
        let mut cmd = Command::new(stall_bin());
        cmd.arg(subcommand).args(self.args());
        let (k, v) = self.env();
        cmd.env(k, v);
        cmd
    }
}

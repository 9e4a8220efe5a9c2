//! Helpers for running external commands with consistent PATH, working directory,
//! echoing and error messages.

use std::env;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use anyhow::{bail, ensure, Context, Result};

/// Root of the workspace: xtask lives one level below it.
pub fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives inside the workspace")
}

/// Cargo's target directory, honouring `CARGO_TARGET_DIR`.
pub fn target_dir() -> PathBuf {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace_root().join(dir),
        None => workspace_root().join("target"),
    }
}

/// Where `cargo install` puts binaries (`$CARGO_HOME/bin`, else `~/.cargo/bin`).
pub fn cargo_bin_dir() -> Option<PathBuf> {
    let home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    Some(home.join("bin"))
}

/// PATH for every child process: the cargo bin dir goes first so that the
/// bpf-linker that setup checked (or installed there) is the one that
/// stall-agent's build script finds.
pub fn tool_path() -> &'static OsStr {
    static PATH: OnceLock<OsString> = OnceLock::new();
    PATH.get_or_init(|| {
        let current = env::var_os("PATH").unwrap_or_default();
        let Some(bin) = cargo_bin_dir() else {
            return current;
        };
        let rest = env::split_paths(&current).filter(|p| *p != bin);
        env::join_paths(std::iter::once(bin.clone()).chain(rest)).unwrap_or(current)
    })
}

/// A command that runs in the workspace root with [`tool_path`] as PATH.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("PATH", tool_path()).current_dir(workspace_root());
    cmd
}

/// The cargo that runs xtask (`$CARGO`), so children use the same toolchain.
pub fn cargo() -> Command {
    command(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Shell-like rendering of a command for logs and errors: explicitly set
/// variables (except PATH) and arguments; cargo is shown by name only.
pub fn describe(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program());
    let program = if program.file_name() == Some(OsStr::new("cargo")) {
        "cargo".into()
    } else {
        program.to_string_lossy()
    };
    let envs = cmd.get_envs().filter_map(|(key, value)| {
        let value = value?;
        (key != "PATH").then(|| format!("{}={}", key.to_string_lossy(), value.to_string_lossy()))
    });
    let args = cmd.get_args().map(|a| a.to_string_lossy().into_owned());
    envs.chain(std::iter::once(program.into_owned())).chain(args).collect::<Vec<_>>().join(" ")
}

/// Runs a command with inherited stdio, echoing it first; fails unless it exits 0.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = describe(cmd);
    println!("xtask: $ {shown}");
    let status = cmd.status().with_context(|| format!("could not start `{shown}`"))?;
    ensure!(status.success(), "`{shown}` failed ({status})");
    Ok(())
}

/// Runs a command quietly and returns its captured output, whatever its exit status.
pub fn output(cmd: &mut Command) -> Result<Output> {
    cmd.output().with_context(|| format!("could not start `{}`", describe(cmd)))
}

/// Whether we run with effective uid 0 (`id -u`; avoids an unsafe libc call).
pub fn is_root() -> Result<bool> {
    let out = output(command("id").arg("-u"))?;
    ensure!(out.status.success(), "`id -u` failed ({})", out.status);
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Fails with `why` unless running as root.
pub fn require_root(why: &str) -> Result<()> {
    if !is_root()? {
        bail!("{why} (run as root, e.g. `sudo -E env PATH=\"$PATH\" cargo xtask ...`)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_commands_like_a_shell() {
        let mut c = command("/some/dir/cargo");
        c.env("STALL_BIN", "/x/stall").args(["test", "--release"]);
        assert_eq!(describe(&c), "STALL_BIN=/x/stall cargo test --release");
    }

    #[test]
    fn cargo_bin_dir_comes_first_on_path() {
        let first = env::split_paths(tool_path()).next();
        assert_eq!(first, cargo_bin_dir());
    }
}

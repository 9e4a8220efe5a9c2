//! Builds the kernel side (`stall-ebpf`) for `bpfel-unknown-none` with
//! Debian's rustc-web and its prebuilt BPF `core` (no nightly, no
//! build-std), and hands the object to the agent, which embeds it.
//!
//! `STALL_BPF_STUB=1` embeds an empty object instead, so the agent can be
//! type-checked (clippy, docs) where the BPF toolchain is absent; such a
//! binary refuses to trace and says why.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

const BPF_RUSTC: &str = "/usr/bin/rustc";
const BPF_TARGET: &str = "bpfel-unknown-none";

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest.parent().unwrap().to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").unwrap());
    let obj = out.join("stall.bpf.o");

    // The commit `stall --version` names (a tarball without git: "unknown").
    let commit = Command::new("git")
        .args(["-C", root.to_str().unwrap(), "rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=STALL_COMMIT=commit {commit}");
    if root.join(".git/HEAD").exists() {
        println!("cargo:rerun-if-changed={}", root.join(".git/HEAD").display());
        println!("cargo:rerun-if-changed={}", root.join(".git/refs").display());
    }
    println!("cargo:rerun-if-env-changed=STALL_BPF_STUB");
    for dir in ["stall-ebpf/src", "stall-common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    println!("cargo:rerun-if-changed={}", root.join("stall-ebpf/Cargo.toml").display());

    if env::var_os("STALL_BPF_STUB").is_some_and(|v| v == "1") {
        std::fs::write(&obj, []).unwrap();
        println!("cargo:rustc-env=STALL_BPF_OBJ={}", obj.display());
        return;
    }
    if let Err(missing) = toolchain_present() {
        panic!(
            "\n\nstall: the BPF toolchain is missing ({missing}).\n\
             Run `cargo xtask build` (it installs it with `cargo xtask setup`),\n\
             or set STALL_BPF_STUB=1 to type-check without a usable kernel side.\n"
        );
    }

    let target_dir = root.join("target/bpf");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--package", "stall-ebpf", "--release", "--target", BPF_TARGET])
        .arg("--target-dir")
        .arg(&target_dir)
        .env("RUSTC", BPF_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        // No `--btf`: the BTF bpf-linker writes for this toolchain has every
        // FUNC pointing at a type id that does not exist, which the kernel
        // rejects ("Invalid type_id"). aya used to drop it silently for the
        // tracepoint programs, but refuses the whole object once it holds
        // fentry/fexit programs; none of the programs needs its own BTF
        // (the trampolines are typed by the kernel's).
        .env("RUSTFLAGS", "-C linker=bpf-linker")
        .env("PATH", path_with_cargo_bin());
    // The outer build's settings are for the host; none may leak into the
    // BPF build.
    for var in [
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTDOCFLAGS",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("running cargo for the BPF object");
    assert!(status.success(), "building stall-ebpf for {BPF_TARGET} failed");

    let built = target_dir.join(BPF_TARGET).join("release/stall");
    std::fs::copy(&built, &obj).unwrap_or_else(|e| panic!("copying {}: {e}", built.display()));
    println!("cargo:rustc-env=STALL_BPF_OBJ={}", obj.display());
}

fn toolchain_present() -> Result<(), String> {
    if !Path::new(BPF_RUSTC).exists() {
        return Err(format!("{BPF_RUSTC} (Debian rustc-web)"));
    }
    if !Path::new("/usr/lib/rustlib").join(BPF_TARGET).exists() {
        return Err("libstd-rust-web-dev-bpf".into());
    }
    let linker_found = env::split_paths(&path_with_cargo_bin()).any(|d| d.join("bpf-linker").exists());
    if !linker_found {
        return Err("bpf-linker".into());
    }
    Ok(())
}

/// PATH with cargo's install directory, where `cargo install bpf-linker` puts it.
fn path_with_cargo_bin() -> std::ffi::OsString {
    let mut dirs: Vec<PathBuf> =
        env::var_os("PATH").map(|p| env::split_paths(&p).collect()).unwrap_or_default();
    let cargo_home = env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    if let Some(home) = cargo_home {
        dirs.push(home.join("bin"));
    }
    env::join_paths(dirs).unwrap()
}

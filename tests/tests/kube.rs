//! `stall daemon --kubernetes` against a real container runtime: Debian's
//! containerd (its CRI plugin, its own state directory and socket) runs a
//! pod the way the kubelet asks for one (CRI calls with the kubelet's
//! metadata and labels, the cgroupfs driver's `kubepods/besteffort/pod<uid>`
//! parent), from an image this test builds (no registry is reachable). The
//! daemon must name the pod, its namespace and its GPU container in
//! `/metrics` and `/jobs`, as the cluster names them.
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use k8s_cri::v1::{
    runtime_service_client::RuntimeServiceClient, ContainerConfig, ContainerMetadata, CreateContainerRequest,
    ImageSpec, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemovePodSandboxRequest, RunPodSandboxRequest,
    StartContainerRequest, StopPodSandboxRequest,
};
use serde_json::{json, Value};
use stall_tests::cgroup::{cgroup2_mount, holds_tasks, remove_tree};
use stall_tests::gpu::ScriptedGpu;
use stall_tests::http::{free_port, http_get};
use stall_tests::procs::{drain, wait_until, Killer};
use stall_tests::scratch::Scratch;
use stall_tests::stall::require_root;
use stall_tests::workload::python;
use tonic::transport::Channel;

const UID: &str = "5f0c7e9a-1b2c-4d3e-8f40-a1b2c3d4e5f6";
const IMAGE: &str = "docker.io/stall/test:1";

#[test]
fn pods_run_by_containerd_are_named_as_the_kubelet_names_them() {
    require_root();
    for tool in ["containerd", "ctr", "runc"] {
        assert!(
            Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success()),
            "{tool} is missing: `cargo xtask test` installs it (Debian's containerd)"
        );
    }
    let mount = cgroup2_mount();
    assert!(
        !holds_tasks(&mount.join("kubepods")) && !holds_tasks(&mount.join("kubepods.slice")),
        "a kubepods cgroup holds tasks: a kubelet runs here, and this test would mix with its pods"
    );
    for dir in kubepods_trees() {
        remove_tree(&dir);
    }
    let mut node = Node::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut cri = rt.block_on(async {
        let channel = stall_agent::daemon::cri::channel(&node.socket).await.expect("containerd's CRI socket");
        RuntimeServiceClient::new(channel)
    });
    let pod_config = pod_config(&node.dir);
    let pod = rt
        .block_on(cri.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(pod_config.clone()),
            runtime_handler: String::new(),
        }))
        .unwrap_or_else(|s| panic!("RunPodSandbox: {s}\n{}", node.log()))
        .into_inner()
        .pod_sandbox_id;
    node.pod = Some(pod.clone());
    // The trainer reads a file over and over; a log shipper sleeps beside it.
    let containers: Vec<String> = [
        ("trainer", "while :; do cat /bin/busybox > /dev/null; sleep 0.2; done"),
        ("log-shipper", "exec sleep 100000"),
    ]
    .iter()
    .map(|(name, script)| {
        let config = ContainerConfig {
            metadata: Some(ContainerMetadata { name: name.to_string(), attempt: 0 }),
            image: Some(ImageSpec { image: IMAGE.into(), ..Default::default() }),
            command: vec!["/bin/sh".into(), "-c".into(), script.to_string()],
            labels: kubelet_labels(&[
                ("io.kubernetes.container.name", name),
                ("io.kubernetes.pod.name", "llama-train-0"),
                ("io.kubernetes.pod.namespace", "research"),
                ("io.kubernetes.pod.uid", UID),
            ]),
            log_path: format!("{name}/0.log"),
            ..Default::default()
        };
        let id = rt
            .block_on(cri.create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(config),
                sandbox_config: Some(pod_config.clone()),
            }))
            .unwrap_or_else(|s| panic!("CreateContainer {name}: {s}\n{}", node.log()))
            .into_inner()
            .container_id;
        rt.block_on(cri.start_container(StartContainerRequest { container_id: id.clone() }))
            .unwrap_or_else(|s| panic!("StartContainer {name}: {s}\n{}", node.log()));
        id
    })
    .collect();

    // The kubelet's cgroupfs layout, in the cgroup2 hierarchy stall reads.
    let pod_cgroup = format!("kubepods/besteffort/pod{UID}");
    let trainer_cgroup = mount.join(&pod_cgroup).join(&containers[0]);
    let mut trainer_pid = 0;
    wait_until("the trainer's process in its container's cgroup", Duration::from_secs(20), || {
        trainer_pid = std::fs::read_to_string(trainer_cgroup.join("cgroup.procs"))
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse().ok()))
            .unwrap_or(0);
        trainer_pid != 0
    });

    // NVML lists the trainer's process (by its host PID) on a busy GPU.
    let gpu = ScriptedGpu::new(&Value::Null);
    let pid_file = gpu.path("trainer.pid");
    std::fs::write(&pid_file, trainer_pid.to_string()).unwrap();
    gpu.update(&json!({"devices": [{"name": "Scripted H200", "power_limit_mw": 700_000,
        "phases": [{"util_pct": 95, "power_mw": 600_000,
                    "processes": [{"pid_file": pid_file, "used_mem_bytes": 1_000_000_000u64}]}]}]}));
    let port = free_port();
    let mut daemon = gpu.command("daemon");
    daemon
        .args(["--kubernetes", "--interval", "1", "--pod-label", "team"])
        .arg("--runtime-endpoint")
        .arg(format!("unix://{}", node.socket.display()))
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::piped());
    let mut guard = Killer(vec![daemon.spawn().unwrap()]);
    let stderr = drain(guard.0[0].stderr.take().unwrap());

    let mut jobs = Value::Null;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        jobs = http_get(port, "/jobs").and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
        // Its first verdict, before a GPU sample, says only that none is
        // known yet: wait for the one the scripted GPU calls for.
        if jobs["jobs"].as_array().is_some_and(|a| a.iter().any(|j| j["verdict"]["kind"] == "gpu-busy")) {
            break;
        }
        sleep(Duration::from_millis(200));
    }
    let metrics = http_get(port, "/metrics").unwrap_or_default();
    let pid = guard.0[0].id() as i32;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).unwrap();
    let exited = guard.0[0].wait().unwrap();
    let said = stderr.join().unwrap();
    assert!(exited.success(), "the daemon's exit: {exited}\n{said}");
    assert!(said.contains("pods named by containerd"), "{said}");

    let list = jobs["jobs"].as_array().unwrap_or_else(|| panic!("no /jobs: {jobs}\n{said}"));
    assert_eq!(list.len(), 1, "the pod is the one job: {jobs}\n{said}");
    let job = &list[0];
    for (key, want) in [
        ("cgroup", pod_cgroup.as_str()),
        ("namespace", "research"),
        ("pod", "llama-train-0"),
        ("container", "trainer"),
        ("pod_uid", UID),
    ] {
        assert_eq!(job[key], want, "{key} in /jobs: {job}\n{said}");
    }
    assert_eq!(job["pod_labels"], json!({"job-name": "llama-train", "team": "nlp"}), "{job}");
    // NVML shows the trainer's process on a GPU at 95 %: the GPU is the
    // bottleneck, whatever the shell does between its reads.
    assert_eq!(job["verdict"]["kind"], "gpu-busy", "the pod's verdict: {job}");

    let series = format!(
        r#"cgroup="{pod_cgroup}",namespace="research",pod="llama-train-0",container="trainer",pod_uid="{UID}""#
    );
    let info = metrics
        .lines()
        .find(|l| l.starts_with("stall_job_info{"))
        .unwrap_or_else(|| panic!("no stall_job_info: {metrics}"));
    assert!(info.starts_with(&format!("stall_job_info{{{series},slurm_job=\"\",")), "{info}");
    assert!(
        info.contains(r#"label_job_name="llama-train""#) && info.contains(r#"label_team="nlp""#),
        "{info}"
    );
    assert!(!info.contains("pod_template_hash"), "only allow-listed pod labels: {info}");
    assert!(info.ends_with(" 1"), "{info}");
    assert!(
        metrics.contains(&format!("stall_verdict{{{series},kind=")),
        "no verdict series of the pod: {metrics}"
    );
    assert!(
        metrics.contains(&format!("stall_read_bytes_total{{{series},role=")),
        "the trainer's reads under the pod's names: {metrics}"
    );
    drop(guard);
    node.stop(&rt, &mut cri);
}

/// A pod's sandbox as the kubelet asks for it: its metadata, its labels,
/// host networking (no CNI here; so no hostname of its own either) and the
/// cgroupfs driver's parent.
fn pod_config(dir: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "llama-train-0".into(),
            uid: UID.into(),
            namespace: "research".into(),
            attempt: 0,
        }),
        log_directory: dir.join("pod-logs").display().to_string(),
        labels: kubelet_labels(&[
            ("job-name", "llama-train"),
            ("team", "nlp"),
            ("pod-template-hash", "5d8f7c"),
            ("io.kubernetes.pod.name", "llama-train-0"),
            ("io.kubernetes.pod.namespace", "research"),
            ("io.kubernetes.pod.uid", UID),
        ]),
        annotations: kubelet_labels(&[("kubernetes.io/config.source", "api")]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/besteffort/pod{UID}"),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn kubelet_labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// `kubepods` in every cgroup hierarchy of the machine (runc makes the
/// pod's cgroups in each v1 controller too, on a hybrid host).
fn kubepods_trees() -> Vec<PathBuf> {
    let mut trees = vec![cgroup2_mount().join("kubepods")];
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        trees.extend(entries.flatten().map(|e| e.path().join("kubepods")).filter(|d| d.is_dir()));
    }
    trees.sort();
    trees.dedup();
    trees
}

/// A containerd of the test's own: its root, state, socket and config in a
/// scratch directory; the test image imported. Dropping it tears down what
/// is left: the pod's processes, the shims, containerd, its mounts and the
/// pod's cgroups.
struct Node {
    dir: PathBuf,
    socket: PathBuf,
    containerd: Child,
    pod: Option<String>,
    _scratch: Scratch,
}

impl Node {
    fn start() -> Self {
        let scratch = Scratch::new("kube");
        let dir = scratch.0.clone();
        let socket = dir.join("containerd.sock");
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  # Sandboxes get oom_score_adj -998, which needs CAP_SYS_RESOURCE (not
  # every test machine has it): no lower than containerd's own instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    # Any filesystem holds it (overlayfs cannot sit on an overlay /tmp).
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}"
    conf_dir = "{cni}"
"#,
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            socket = socket.display(),
            cni = dir.join("cni").display(),
        );
        std::fs::write(dir.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let containerd = Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let node =
            Self { dir: dir.clone(), socket: socket.clone(), containerd, pod: None, _scratch: scratch };
        wait_until("containerd's socket", Duration::from_secs(30), || socket.exists());
        let image = dir.join("image.tar");
        let built = Command::new(python())
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads/oci_image.py"))
            .arg(&image)
            .arg(IMAGE)
            .arg(busybox())
            .args(["/bin/sleep", "100000"])
            .status()
            .unwrap();
        assert!(built.success(), "building the test image");
        let import = Command::new("ctr")
            .arg("--address")
            .arg(&socket)
            .args(["--namespace", "k8s.io", "images", "import"])
            .arg(&image)
            .output()
            .unwrap();
        assert!(
            import.status.success(),
            "ctr images import: {}\n{}",
            String::from_utf8_lossy(&import.stderr),
            node.log()
        );
        node
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        format!("containerd's log, last lines:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
    }

    /// Stops and removes the pod as the kubelet would.
    fn stop(&mut self, rt: &tokio::runtime::Runtime, cri: &mut RuntimeServiceClient<Channel>) {
        if let Some(pod) = self.pod.take() {
            rt.block_on(cri.stop_pod_sandbox(StopPodSandboxRequest { pod_sandbox_id: pod.clone() }))
                .unwrap_or_else(|s| panic!("StopPodSandbox: {s}"));
            rt.block_on(cri.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: pod }))
                .unwrap_or_else(|s| panic!("RemovePodSandbox: {s}"));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The pod's processes, wherever a failed test left them.
        for tree in kubepods_trees() {
            kill_tree(&tree);
        }
        // containerd's shims for this socket (they outlive containerd).
        let socket = self.socket.display().to_string();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.starts_with("/usr/bin/containerd-shim") && cmdline.contains(&socket) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = self.containerd.kill();
        let _ = self.containerd.wait();
        // The containers' root filesystems and the sandbox's shm, deepest
        // first, so that the scratch directory can go.
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut under: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| Path::new(m).starts_with(&self.dir))
            .collect();
        under.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in under {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
        wait_until("the pod's cgroups empty", Duration::from_secs(10), || {
            kubepods_trees().iter().all(|t| !holds_tasks(t))
        });
        for tree in kubepods_trees() {
            remove_tree(&tree);
        }
    }
}

/// SIGKILL to every process in a cgroup tree.
fn kill_tree(dir: &Path) {
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.path().is_dir() {
            kill_tree(&e.path());
        }
    }
}

/// A statically linked busybox for the image (Debian's busybox-static):
/// an ELF without an interpreter (no PT_INTERP program header).
fn busybox() -> PathBuf {
    let path = PathBuf::from("/bin/busybox");
    let elf = std::fs::read(&path).unwrap_or_default();
    let u16_at = |o: usize| elf.get(o..o + 2).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let u32_at = |o: usize| elf.get(o..o + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().unwrap()));
    let u64_at =
        |o: usize| elf.get(o..o + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()) as usize);
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    let is_elf = elf.starts_with(b"\x7fELF") && phnum > 0;
    let interpreted = (0..phnum).any(|i| u32_at(phoff + i * phentsize) == 3);
    assert!(
        is_elf && !interpreted,
        "{} must be a static busybox: `cargo xtask test` installs busybox-static",
        path.display()
    );
    path
}

//! Who a job is, in the names its cluster uses: namespace, pod and container
//! names and the pod's UID, from the container runtime (CRI); the pod UID
//! alone, from the cgroup path, where no runtime answers; the Slurm job id
//! from the path of a Slurm job's cgroup. These are the labels that join
//! stall's series with dcgm-exporter's, cAdvisor's and kube-state-metrics'.
use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    time::{Duration, Instant},
};

use super::{
    cri::{Pod, Runtime},
    kube,
};

/// Pod labels exported on `stall_job_info` without being asked for: the
/// ones that name the job or the application a pod belongs to (Job,
/// Kubeflow's training operator, JobSet, the recommended app label).
pub const POD_LABELS: [&str; 5] = [
    "job-name",
    "batch.kubernetes.io/job-name",
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "app.kubernetes.io/name",
];

/// The runtime is asked again for a pod it did not list at most this often.
const ASK_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    pub pod_uid: String,
    /// The name of the pod's container that holds the GPU (or its only one).
    pub container: String,
    /// The Slurm job whose cgroup this is.
    pub slurm_job: String,
    /// The allow-listed labels of the pod.
    pub pod_labels: BTreeMap<String, String>,
}

/// The runtime's pods, as last listed, and which of their labels to export.
pub struct Identities {
    /// Whether to ask a container runtime at all (on a Kubernetes node).
    ask_runtime: bool,
    /// Its socket; None: the first default one that exists.
    socket: Option<PathBuf>,
    runtime: Option<Runtime>,
    pods: HashMap<String, Pod>,
    asked: Option<Instant>,
    allowed: Vec<String>,
    /// The last failure said, so that a runtime down says so once.
    failing: Option<String>,
}

impl Identities {
    /// Names from the runtime at `socket` (or a default one) when
    /// `ask_runtime`; from cgroup paths alone otherwise.
    pub fn new(ask_runtime: bool, socket: Option<PathBuf>, extra_labels: &[String]) -> Self {
        let mut allowed: Vec<String> = POD_LABELS.iter().map(|s| s.to_string()).collect();
        allowed.extend(extra_labels.iter().filter(|l| !allowed.contains(l)).cloned().collect::<Vec<_>>());
        Self { ask_runtime, socket, runtime: None, pods: HashMap::new(), asked: None, allowed, failing: None }
    }

    /// Connects to the runtime, saying which one names the pods, or why
    /// none does (pods are then named by UID; it is tried again as pods
    /// appear).
    pub async fn connect(&mut self) {
        if !self.ask_runtime || self.runtime.is_some() {
            return;
        }
        match Runtime::connect(self.socket.as_deref()).await {
            Ok(r) => {
                eprintln!("stall daemon: pods named by {} at {}", r.version, r.path.display());
                self.failing = None;
                self.runtime = Some(r);
            }
            Err(e) => self.failed(e.to_string()),
        }
    }

    fn failed(&mut self, why: String) {
        if self.failing.as_ref() != Some(&why) {
            eprintln!("stall daemon: {why}; pods are named by UID until it answers");
        }
        self.failing = Some(why);
    }

    /// Lists the runtime's pods again if one of `uids` is not among them
    /// (a pod that appeared since), at most once a second.
    pub async fn learn(&mut self, uids: &[String]) {
        if !self.ask_runtime
            || uids.iter().all(|u| self.pods.contains_key(u))
            || self.asked.is_some_and(|t| t.elapsed() < ASK_EVERY)
        {
            return;
        }
        self.asked = Some(Instant::now());
        self.connect().await;
        let Some(runtime) = self.runtime.as_mut() else { return };
        match runtime.pods().await {
            Ok(pods) => {
                self.pods = pods.into_iter().map(|p| (p.uid.clone(), p)).collect();
                if self.failing.take().is_some() {
                    eprintln!("stall daemon: the container runtime answers again");
                }
            }
            Err(e) => self.failed(e.to_string()),
        }
    }

    /// Whether the runtime listed the pod `uid`.
    pub fn knows(&self, uid: &str) -> bool {
        self.pods.contains_key(uid)
    }

    /// The identity of the job at cgroup `path` (relative to the cgroup
    /// mount); `container_id` is the container its GPU process runs in,
    /// where known.
    pub fn of(&self, path: &str, container_id: Option<&str>) -> Identity {
        let ids = kube::parse(path);
        let mut id = Identity { slurm_job: slurm_job(path).unwrap_or_default(), ..Default::default() };
        let Some(pod) = self.pods.get(&ids.pod) else {
            id.pod_uid = ids.pod;
            return id;
        };
        id.namespace = pod.namespace.clone();
        id.pod = pod.name.clone();
        id.pod_uid = pod.uid.clone();
        id.pod_labels = pod
            .labels
            .iter()
            .filter(|(k, _)| self.allowed.contains(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        id.container = container_id
            .and_then(|c| pod.containers.get(c))
            .cloned()
            .or_else(|| only_name(&pod.containers))
            .unwrap_or_default();
        id
    }
}

/// The name all of a pod's containers share (one container, perhaps
/// restarted), if they share one.
fn only_name(containers: &BTreeMap<String, String>) -> Option<String> {
    let mut names = containers.values();
    let first = names.next()?;
    names.all(|n| n == first).then(|| first.clone())
}

/// The Slurm job id in a cgroup path: `job_<id>` under slurmstepd's scope
/// (cgroup v2) or under `slurm/uid_<uid>/` (the v1 layout).
pub fn slurm_job(path: &str) -> Option<String> {
    if !path.contains("slurm") {
        return None;
    }
    path.split('/').find_map(|part| {
        let id = part.strip_prefix("job_")?;
        (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then(|| id.to_string())
    })
}

/// A pod label as a Prometheus label name, the way kube-state-metrics
/// spells them: `label_` and the name with every other character as `_`.
pub fn label_name(pod_label: &str) -> String {
    let mut out = String::from("label_");
    out.extend(pod_label.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b7b6f5e-6c9a-4f55-9f0a-3f2d1c0b9a87";
    const CID: &str = "4a3f6c2e1b0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b";
    const SIDECAR: &str = "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b4a3f6c2e1b0d9c8b7a6f5e4d3c2b1a0f";

    fn pods(containers: &[(&str, &str)]) -> Identities {
        let mut ids = Identities::new(false, None, &["team".to_string()]);
        let pod = Pod {
            uid: UID.into(),
            namespace: "research".into(),
            name: "llama-train-0".into(),
            labels: [
                ("job-name", "llama-train"),
                ("team", "nlp"),
                ("pod-template-hash", "5d8f"),
                ("io.kubernetes.pod.uid", UID),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            containers: containers.iter().map(|(id, n)| (id.to_string(), n.to_string())).collect(),
        };
        ids.pods.insert(UID.into(), pod);
        ids
    }

    #[test]
    fn a_listed_pod_is_named_with_its_allowed_labels_and_its_gpu_container() {
        let ids = pods(&[(CID, "trainer"), (SIDECAR, "log-shipper")]);
        let path = format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            UID.replace('-', "_")
        );
        let id = ids.of(&path, Some(CID));
        assert_eq!(
            (id.namespace.as_str(), id.pod.as_str(), id.pod_uid.as_str()),
            ("research", "llama-train-0", UID)
        );
        assert_eq!(id.container, "trainer");
        let labels: Vec<(&str, &str)> = id.pod_labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(labels, [("job-name", "llama-train"), ("team", "nlp")]);
        // Two containers and no GPU process to tell them apart: no name.
        assert_eq!(ids.of(&path, None).container, "");
        assert_eq!(pods(&[(CID, "trainer")]).of(&path, None).container, "trainer");
    }

    #[test]
    fn without_the_runtime_a_pod_is_its_uid_and_a_slurm_job_its_id() {
        let ids = Identities::new(false, None, &[]);
        let id = ids.of(&format!("kubepods/besteffort/pod{UID}"), None);
        assert_eq!(id, Identity { pod_uid: UID.into(), ..Default::default() });
        assert!(!ids.knows(UID));
        let v2 = ids.of("system.slice/slurmstepd.scope/job_4711", None);
        assert_eq!((v2.slurm_job.as_str(), v2.pod_uid.as_str()), ("4711", ""));
        assert_eq!(slurm_job("slurm/uid_1000/job_88/step_0"), Some("88".into()));
        assert_eq!(slurm_job("system.slice/job_88"), None);
        assert_eq!(slurm_job("system.slice/slurmstepd.scope/job_x"), None);
    }

    #[test]
    fn pod_labels_are_named_as_kube_state_metrics_names_them() {
        assert_eq!(label_name("batch.kubernetes.io/job-name"), "label_batch_kubernetes_io_job_name");
        assert_eq!(label_name("job-name"), "label_job_name");
    }
}

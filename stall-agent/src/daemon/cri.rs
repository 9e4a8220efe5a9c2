//! The node's container runtime, asked through its CRI API (the kubelet's
//! own interface; containerd and CRI-O serve it on a Unix socket) which pod
//! and container each cgroup belongs to, by name: the daemon needs no
//! credentials for the API server, as Falco and Tetragon do not.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_cri::v1::{
    runtime_service_client::RuntimeServiceClient, ListContainersRequest, ListPodSandboxRequest,
    VersionRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

/// Where runtimes listen by default: containerd, CRI-O, k3s's containerd.
pub const DEFAULT_SOCKETS: [&str; 3] =
    ["/run/containerd/containerd.sock", "/run/crio/crio.sock", "/run/k3s/containerd/containerd.sock"];

/// No call may hold the main loop longer than this.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("no container runtime socket at {}", DEFAULT_SOCKETS.join(", "))]
    NoSocket,
    #[error("cannot reach the container runtime at {path}: {why}")]
    Unreachable { path: PathBuf, why: String },
    #[error("the container runtime at {path} failed {call}: {why}")]
    Call { path: PathBuf, call: &'static str, why: String },
}

/// A pod as the runtime lists it (the kubelet gave it these names).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pod {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The pod's labels, as the kubelet passed them to its sandbox.
    pub labels: BTreeMap<String, String>,
    /// Its containers, by container id: their names.
    pub containers: BTreeMap<String, String>,
}

/// A connection to the runtime.
pub struct Runtime {
    pub path: PathBuf,
    /// "containerd v1.6.20", as the runtime names itself.
    pub version: String,
    client: RuntimeServiceClient<Channel>,
}

/// A gRPC channel over the Unix socket `path` (the URI is a placeholder:
/// the connector ignores it).
pub async fn channel(path: &Path) -> Result<Channel, CriError> {
    let unreachable = |why: String| CriError::Unreachable { path: path.to_path_buf(), why };
    let socket = path.to_path_buf();
    Endpoint::try_from("http://cri.invalid")
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(CALL_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let socket = socket.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(socket).await?,
                ))
            }
        }))
        .await
        .map_err(|e| unreachable(crate::error::chain(&e)))
}

impl Runtime {
    /// Connects to the runtime at `socket`, or at the first default socket
    /// that exists, and asks its version (so a socket that is not a CRI
    /// runtime fails here, once).
    pub async fn connect(socket: Option<&Path>) -> Result<Self, CriError> {
        let path = match socket {
            Some(p) => p.to_path_buf(),
            None => {
                DEFAULT_SOCKETS.iter().map(PathBuf::from).find(|p| p.exists()).ok_or(CriError::NoSocket)?
            }
        };
        let mut client = RuntimeServiceClient::new(channel(&path).await?);
        let v = client
            .version(VersionRequest { version: "v1".into() })
            .await
            .map_err(|s| CriError::Call {
                path: path.clone(),
                call: "Version",
                why: s.message().to_string(),
            })?
            .into_inner();
        Ok(Self { path, version: format!("{} {}", v.runtime_name, v.runtime_version), client })
    }

    /// Every pod the runtime holds, with its containers' names.
    pub async fn pods(&mut self) -> Result<Vec<Pod>, CriError> {
        let failed = |call: &'static str, s: tonic::Status| CriError::Call {
            path: self.path.clone(),
            call,
            why: s.message().to_string(),
        };
        let sandboxes = self
            .client
            .list_pod_sandbox(ListPodSandboxRequest { filter: None })
            .await
            .map_err(|s| failed("ListPodSandbox", s))?
            .into_inner()
            .items;
        let containers = self
            .client
            .list_containers(ListContainersRequest { filter: None })
            .await
            .map_err(|s| failed("ListContainers", s))?
            .into_inner()
            .containers;
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        for s in sandboxes {
            let Some(m) = s.metadata else { continue };
            pods.insert(
                s.id,
                Pod {
                    uid: m.uid,
                    namespace: m.namespace,
                    name: m.name,
                    labels: s.labels.into_iter().collect(),
                    containers: BTreeMap::new(),
                },
            );
        }
        for c in containers {
            if let (Some(pod), Some(m)) = (pods.get_mut(&c.pod_sandbox_id), c.metadata) {
                pod.containers.insert(c.id, m.name);
            }
        }
        Ok(pods.into_values().collect())
    }
}

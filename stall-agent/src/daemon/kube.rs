//! Where the kubelet keeps its pods' cgroups, and pod and container ids
//! from cgroup paths, for metric labels. Handles the cgroupfs layout
//! (`kubepods/burstable/pod<uid>/<container>`) and the systemd one
//! (`kubepods-burstable-pod<uid_with_underscores>.slice/
//! cri-containerd-<id>.scope`).
use std::path::{Path, PathBuf};

/// The pod cgroups of a node: the kubelet's top cgroup and its QoS levels
/// (Guaranteed pods sit in the top one, Burstable and BestEffort pods one
/// level down).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRoots {
    /// `systemd` or `cgroupfs`, as the kubelet's `cgroupDriver` names it.
    pub driver: &'static str,
    pub roots: Vec<PathBuf>,
}

/// The kubelet's pod cgroups under the cgroup2 mount `mount`, whichever
/// driver made them; None on a node without them.
pub fn pod_roots(mount: &Path) -> Option<PodRoots> {
    let layouts: [(&str, &str, [&str; 2]); 2] = [
        ("systemd", "kubepods.slice", ["kubepods-burstable.slice", "kubepods-besteffort.slice"]),
        ("cgroupfs", "kubepods", ["burstable", "besteffort"]),
    ];
    layouts.into_iter().find_map(|(driver, top, qos)| {
        let top = mount.join(top);
        if !top.is_dir() {
            return None;
        }
        let mut roots = vec![top.clone()];
        roots.extend(qos.iter().map(|q| top.join(q)).filter(|d| d.is_dir()));
        Some(PodRoots { driver, roots })
    })
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ids {
    pub pod: String,
    pub container: String,
}

pub fn parse(path: &str) -> Ids {
    let mut ids = Ids::default();
    for part in path.split('/') {
        if let Some(uid) = pod_uid(part) {
            ids.pod = uid;
        } else if !ids.pod.is_empty() {
            if let Some(c) = container_id(part) {
                ids.container = c;
            }
        }
    }
    ids
}

fn pod_uid(part: &str) -> Option<String> {
    let part = part.strip_suffix(".slice").unwrap_or(part);
    let at = part.rfind("pod")?;
    let uid = &part[at + 3..];
    // A pod uid is a UUID; systemd spells its dashes as underscores.
    let uid = uid.replace('_', "-");
    (uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')).then_some(uid)
}

fn container_id(part: &str) -> Option<String> {
    let part = part.strip_suffix(".scope").unwrap_or(part);
    let id = part.rsplit('-').next().unwrap_or(part);
    (id.len() == 64 && id.chars().all(|c| c.is_ascii_hexdigit())).then(|| id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b7b6f5e-6c9a-4f55-9f0a-3f2d1c0b9a87";
    const CID: &str = "4a3f6c2e1b0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b";

    #[test]
    fn pod_roots_follow_the_cgroup_driver() {
        let base = std::env::temp_dir().join(format!("stall-kube-roots-{}", std::process::id()));
        let mk = |p: &str| std::fs::create_dir_all(base.join(p)).unwrap();
        let _ = std::fs::remove_dir_all(&base);
        mk("system.slice");
        assert_eq!(pod_roots(&base), None);
        mk("kubepods/burstable");
        mk("kubepods/besteffort");
        let got = pod_roots(&base).unwrap();
        assert_eq!(got.driver, "cgroupfs");
        assert_eq!(
            got.roots,
            ["kubepods", "kubepods/burstable", "kubepods/besteffort"].map(|p| base.join(p))
        );
        // The systemd layout wins where both exist (a node moved to it).
        mk("kubepods.slice/kubepods-burstable.slice");
        let got = pod_roots(&base).unwrap();
        assert_eq!(got.driver, "systemd");
        assert_eq!(
            got.roots,
            ["kubepods.slice", "kubepods.slice/kubepods-burstable.slice"].map(|p| base.join(p))
        );
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn cgroupfs_layout() {
        let ids = parse(&format!("kubepods/burstable/pod{UID}/{CID}"));
        assert_eq!(ids, Ids { pod: UID.into(), container: CID.into() });
    }

    #[test]
    fn systemd_layout() {
        let p = format!(
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope",
            UID.replace('-', "_")
        );
        assert_eq!(parse(&p), Ids { pod: UID.into(), container: CID.into() });
        assert_eq!(parse(&format!("kubepods-besteffort-pod{}.slice", UID.replace('-', "_"))).pod, UID);
    }

    #[test]
    fn other_paths_have_no_ids() {
        assert_eq!(parse("system.slice/training.service"), Ids::default());
        assert_eq!(parse("jobs/podcast-render"), Ids::default());
    }
}

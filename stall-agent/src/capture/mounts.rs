//! Which filesystem serves a file, where that is neither a local disk nor
//! memory: a FUSE server in user space (s3fs, gcsfuse, a cluster's FUSE
//! client) or a network filesystem. Their bytes never pass the block layer,
//! so a read that counts nothing from storage did not come from the page
//! cache either. From the file's device and the mount table of the
//! process that opened it (/proc/PID/mountinfo).
use std::{collections::HashMap, fs, os::unix::fs::MetadataExt};

/// The mount types of the devices files were found on, by mount namespace
/// and device: a job that opens a file per sample asks for each, and a
/// node's mount table can be long.
#[derive(Default)]
pub struct Mounts {
    by_device: HashMap<(u64, u64), Option<String>>,
}

impl Mounts {
    /// The type of the mount serving `path` as process `pid` sees it,
    /// where its bytes come from a server rather than a local disk or
    /// memory (`fuse.s3fs`, `nfs4`, `ceph`); None for local filesystems, or
    /// where the process or the path is gone. One stat per call; the mount
    /// table is read once per device.
    pub fn remote_filesystem(&mut self, pid: u32, path: &str) -> Option<String> {
        if !path.starts_with('/') {
            return None;
        }
        let dev = fs::metadata(format!("/proc/{pid}/root{path}")).ok()?.dev();
        let ns = fs::metadata(format!("/proc/{pid}/ns/mnt")).ok()?.ino();
        // Mounts come and go; a table this long is a node's churn.
        if self.by_device.len() > 1024 {
            self.by_device.clear();
        }
        self.by_device
            .entry((ns, dev))
            .or_insert_with(|| {
                let table = fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
                fstype_of(&table, libc::major(dev), libc::minor(dev)).filter(|t| is_remote(t))
            })
            .clone()
    }
}

/// The type of the mount of device `major:minor` in the text of a
/// mountinfo (`36 35 0:48 / /mnt rw,nosuid - fuse.slowfs slowfs ro,…`:
/// the device is the third field, the type the first after ` - `).
pub fn fstype_of(mountinfo: &str, major: u32, minor: u32) -> Option<String> {
    let dev = format!("{major}:{minor}");
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        (mount.split_whitespace().nth(2)? == dev).then(|| fs.split_whitespace().next().map(str::to_string))?
    })
}

/// Filesystems whose bytes come from a server: FUSE (in user space), and
/// the network and cluster filesystems.
pub fn is_remote(fstype: &str) -> bool {
    const NETWORK: [&str; 14] = [
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "ceph",
        "lustre",
        "9p",
        "virtiofs",
        "gpfs",
        "beegfs",
        "wekafs",
        "glusterfs",
        "afs",
        "orangefs",
    ];
    fstype == "fuse" || fstype.starts_with("fuse.") || fstype == "fuseblk" || NETWORK.contains(&fstype)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_files_mount_type_comes_from_its_device() {
        let table = "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
                     36 22 0:48 / /mnt/data ro,nosuid,nodev shared:30 - fuse.slowfs slowfs ro,user_id=0,group_id=0\n\
                     37 22 0:52 / /mnt/nfs rw,relatime shared:31 - nfs4 10.0.0.2:/export rw,vers=4.2\n";
        assert_eq!(fstype_of(table, 0, 48).as_deref(), Some("fuse.slowfs"));
        assert_eq!(fstype_of(table, 0, 52).as_deref(), Some("nfs4"));
        assert_eq!(fstype_of(table, 254, 1).as_deref(), Some("ext4"));
        assert_eq!(fstype_of(table, 0, 99), None);
        assert!(is_remote("fuse.slowfs") && is_remote("nfs4") && is_remote("fuseblk"));
        assert!(!is_remote("ext4") && !is_remote("tmpfs") && !is_remote("overlay") && !is_remote("fusectl"));
    }

    #[test]
    fn a_file_on_a_local_disk_is_served_by_no_server() {
        let me = std::process::id();
        let mut mounts = Mounts::default();
        assert_eq!(mounts.remote_filesystem(me, "/proc/self/exe"), None);
        assert_eq!(mounts.remote_filesystem(me, "/no/such/file"), None);
        assert_eq!(mounts.remote_filesystem(me, "relative/path"), None);
        assert_eq!(mounts.by_device.len(), 1, "one device asked about");
    }
}

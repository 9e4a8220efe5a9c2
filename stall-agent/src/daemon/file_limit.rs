//! The daemon's own limit on open files.

/// Raises the soft limit on open files to the hard one, as a service
/// manager's soft default (1,024 under systemd) leaves little beside 512
/// connections and the capture's own descriptors: `--http-max-connections`
/// decides. The daemon starts no process to inherit it. (soft before, now).
pub(super) fn raise() -> std::io::Result<(u64, u64)> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok((soft, getrlimit(Resource::RLIMIT_NOFILE)?.0))
}

#[cfg(test)]
mod tests {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};

    #[test]
    fn the_soft_file_limit_is_raised_to_the_hard_one() {
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        // One below the hard limit: raised from, and no less room for the
        // tests beside this one than they had.
        let lowered = soft.min(hard - 1);
        setrlimit(Resource::RLIMIT_NOFILE, lowered, hard).unwrap();
        let raised = super::raise().unwrap();
        let now = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
        assert_eq!(raised, (lowered, hard));
        assert_eq!(now, (hard, hard));
    }
}

//! `stall-slowfs SOURCE MOUNTPOINT MBPS`: serves the regular files at the
//! top of SOURCE, read-only, at MOUNTPOINT (type `fuse.slowfs`), handing
//! out at most MBPS megabytes a second: each read waits its share of time
//! before its bytes come back, as a remote object store behind a FUSE
//! client would. Prints `ready PID` once mounted; unmounts on SIGTERM or
//! SIGINT.
use std::{
    collections::HashMap,
    ffi::OsStr,
    fs,
    os::unix::fs::{FileExt, MetadataExt},
    path::PathBuf,
    process::ExitCode,
    time::{Duration, UNIX_EPOCH},
};

use fuser::{
    FileAttr, FileType, Filesystem, MountOption, ReplyAttr, ReplyData, ReplyDirectory, ReplyEntry, Request,
};
use nix::sys::signal::{SigSet, Signal};

const ROOT: u64 = 1;
const TTL: Duration = Duration::from_secs(60);

struct SlowFs {
    /// By inode (2 on): the file's name and path in SOURCE.
    files: Vec<(String, PathBuf)>,
    by_name: HashMap<String, u64>,
    bytes_per_s: f64,
}

impl SlowFs {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
        let (kind, size, perm, nlink) = if ino == ROOT {
            (FileType::Directory, 0, 0o555, 2)
        } else {
            let (_, path) = self.files.get(usize::try_from(ino).ok()?.checked_sub(2)?)?;
            (FileType::RegularFile, fs::metadata(path).ok()?.size(), 0o444, 1)
        };
        Some(FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind,
            perm,
            nlink,
            uid: 0,
            gid: 0,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        })
    }
}

impl Filesystem for SlowFs {
    fn lookup(&mut self, _req: &Request, parent: u64, name: &OsStr, reply: ReplyEntry) {
        let found = name.to_str().and_then(|n| self.by_name.get(n)).copied();
        match found.filter(|_| parent == ROOT).and_then(|ino| self.attr(ino)) {
            Some(attr) => reply.entry(&TTL, &attr, 0),
            None => reply.error(libc::ENOENT),
        }
    }

    fn getattr(&mut self, _req: &Request, ino: u64, _fh: Option<u64>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(attr) => reply.attr(&TTL, &attr),
            None => reply.error(libc::ENOENT),
        }
    }

    fn read(
        &mut self,
        _req: &Request,
        ino: u64,
        _fh: u64,
        offset: i64,
        size: u32,
        _flags: i32,
        _lock: Option<u64>,
        reply: ReplyData,
    ) {
        let Some((_, path)) = ino.checked_sub(2).and_then(|i| self.files.get(i as usize)) else {
            return reply.error(libc::ENOENT);
        };
        let mut buf = vec![0; size as usize];
        let n = match fs::File::open(path).and_then(|f| f.read_at(&mut buf, offset.max(0) as u64)) {
            Ok(n) => n,
            Err(e) => return reply.error(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        // One request at a time (the session is single-threaded): the
        // pause is the filesystem's pace.
        std::thread::sleep(Duration::from_secs_f64(n as f64 / self.bytes_per_s));
        reply.data(&buf[..n]);
    }

    fn readdir(&mut self, _req: &Request, ino: u64, _fh: u64, offset: i64, mut reply: ReplyDirectory) {
        if ino != ROOT {
            return reply.error(libc::ENOTDIR);
        }
        let dots = [(ROOT, FileType::Directory, "."), (ROOT, FileType::Directory, "..")];
        let files = self
            .files
            .iter()
            .enumerate()
            .map(|(i, (n, _))| (i as u64 + 2, FileType::RegularFile, n.as_str()));
        for (i, (ino, kind, name)) in dots.into_iter().chain(files).enumerate().skip(offset as usize) {
            if reply.add(ino, i as i64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, source, mountpoint, mbps] = args.as_slice() else {
        eprintln!("usage: stall-slowfs SOURCE MOUNTPOINT MBPS");
        return ExitCode::from(2);
    };
    let Ok(mbps) = mbps.parse::<f64>() else {
        eprintln!("stall-slowfs: MBPS must be a number, not {mbps:?}");
        return ExitCode::from(2);
    };
    let mut files: Vec<(String, PathBuf)> = match fs::read_dir(source) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
            .collect(),
        Err(e) => {
            eprintln!("stall-slowfs: cannot read {source}: {e}");
            return ExitCode::from(1);
        }
    };
    files.sort();
    let by_name = files.iter().enumerate().map(|(i, (n, _))| (n.clone(), i as u64 + 2)).collect();
    let fs = SlowFs { files, by_name, bytes_per_s: mbps * 1e6 };
    // Blocked before the session's thread starts, so that it inherits the
    // mask and the signals wait for this thread's sigwait.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    if let Err(e) = signals.thread_block() {
        eprintln!("stall-slowfs: blocking signals: {e}");
        return ExitCode::from(1);
    }
    let options =
        [MountOption::RO, MountOption::FSName("slowfs".into()), MountOption::Subtype("slowfs".into())];
    let session = match fuser::spawn_mount2(fs, mountpoint, &options) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stall-slowfs: cannot mount at {mountpoint}: {e}");
            return ExitCode::from(1);
        }
    };
    println!("ready {}", std::process::id());
    let _ = signals.wait();
    // Dropping the session unmounts it.
    drop(session);
    ExitCode::SUCCESS
}

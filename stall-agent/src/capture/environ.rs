//! The environment a process has now, read from its memory: the C
//! library's `environ` array, where `setenv` and `putenv` (and so Python's
//! `os.environ[...] = ...`) put what a process sets after it started;
//! `/proc/PID/environ` shows only what it was exec'd with. Of each entry
//! the name is read first, and the value only for a name
//! [`crate::rank::is_listed`] keeps. Needs what `process_vm_readv` needs
//! (root, or CAP_SYS_PTRACE); reads the library through /proc/PID/root, so
//! it works across mount namespaces.
use std::{collections::HashMap, fs};

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::rank::{is_listed, VALUE_MAX};

/// Most entries followed (a runaway array is not followed further).
const ENTRIES_MAX: usize = 16_384;
/// The longest listed name, with its `=`.
const NAME_MAX: usize = 32;

/// Where `environ` lies in each C library seen (by device and inode), so a
/// library is parsed once however many processes map it.
#[derive(Default)]
pub struct EnvironReader {
    symbols: HashMap<(String, u64), Option<Symbol>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Symbol {
    /// `environ`'s address relative to the library's first loaded page.
    offset: u64,
    pointer: usize,
}

/// A file mapping of /proc/PID/maps.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mapping {
    start: u64,
    offset: u64,
    dev: String,
    inode: u64,
    path: String,
}

fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let (range, _perms, offset, dev, inode) = (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
            let path = f.collect::<Vec<_>>().join(" ");
            Some(Mapping {
                start: u64::from_str_radix(range.split_once('-')?.0, 16).ok()?,
                offset: u64::from_str_radix(offset, 16).ok()?,
                dev: dev.to_string(),
                inode: inode.parse().ok()?,
                path,
            })
        })
        .filter(|m| m.path.starts_with('/'))
        .collect()
}

/// The mapped files that may define `environ`, each where its first page
/// is mapped: the program first (a program that uses `environ` holds the
/// variable itself, the C library's copy relocated there, and so does one
/// linked statically), then the C library (glibc's `libc.so.6`, musl's
/// loader).
fn candidates<'a>(maps: &'a [Mapping], program: &str) -> Vec<&'a Mapping> {
    let first_pages = maps.iter().filter(|m| m.offset == 0);
    let is_libc = |m: &&Mapping| {
        let name = m.path.rsplit('/').next().unwrap_or("");
        name.starts_with("libc.so") || name.starts_with("libc-") || name.starts_with("ld-musl-")
    };
    let mut out: Vec<&Mapping> = first_pages.clone().filter(|m| m.path == program).take(1).collect();
    out.extend(first_pages.filter(is_libc));
    out
}

fn symbol_of(elf: &[u8]) -> Option<Symbol> {
    let file = object::File::parse(elf).ok()?;
    let first_load = file.segments().map(|s| s.address()).min()? & !0xfff;
    let sym = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|s| matches!(s.name(), Ok("__environ" | "environ" | "_environ")) && s.address() != 0)?;
    Some(Symbol { offset: sym.address() - first_load, pointer: if file.is_64() { 8 } else { 4 } })
}

impl EnvironReader {
    /// The listed entries of the process's environment now, NUL-separated
    /// `NAME=value` as `/proc/PID/environ` has them; None when its memory
    /// or its C library cannot be read.
    /// The walk reads pointers the process may be rewriting: a torn one is
    /// a failed read, never the agent's end.
    pub fn read(&mut self, pid: u32) -> Option<Vec<u8>> {
        crate::contain::contained(|| self.walk(pid)).ok().flatten()
    }

    fn walk(&mut self, pid: u32) -> Option<Vec<u8>> {
        let maps = parse_maps(&fs::read_to_string(format!("/proc/{pid}/maps")).ok()?);
        let program = fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        let (map, sym) = candidates(&maps, &program.to_string_lossy()).into_iter().find_map(|m| {
            let sym = *self.symbols.entry((m.dev.clone(), m.inode)).or_insert_with(|| {
                let elf = fs::read(format!("/proc/{pid}/root{}", m.path)).ok()?;
                symbol_of(&elf)
            });
            Some((m, sym?))
        })?;
        let memory = Memory { pid, pointer: sym.pointer };
        let array = memory.pointer_at(map.start + sym.offset)?;
        let mut out = Vec::new();
        for i in 0..ENTRIES_MAX as u64 {
            let entry = memory.pointer_at(array + i * sym.pointer as u64)?;
            if entry == 0 {
                return Some(out);
            }
            let head = memory.bytes(entry, NAME_MAX);
            let Some(eq) = head.iter().position(|b| *b == b'=' || *b == 0).filter(|e| head[*e] == b'=')
            else {
                continue;
            };
            if !is_listed(&head[..eq]) {
                continue;
            }
            let whole = memory.bytes(entry, eq + 1 + VALUE_MAX);
            let end = whole.iter().position(|b| *b == 0).unwrap_or(whole.len());
            out.extend_from_slice(&whole[..end]);
            out.push(0);
        }
        Some(out)
    }
}

/// Another process's memory, read without stopping it.
struct Memory {
    pid: u32,
    pointer: usize,
}

impl Memory {
    /// Up to `len` bytes from `addr`, stopping early at a page that is not
    /// mapped (each read stays within a page, so the mapped part is read).
    fn bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let mut done = 0;
        while done < len {
            let at = addr + done as u64;
            let in_page = (0x1000 - (at & 0xfff)) as usize;
            let want = in_page.min(len - done);
            let got = read_remote(self.pid, at, &mut out[done..done + want]);
            done += got;
            if got < want {
                break;
            }
            if out[done - got..done].contains(&0) {
                break;
            }
        }
        out.truncate(done);
        out
    }

    fn pointer_at(&self, addr: u64) -> Option<u64> {
        let b = self.bytes(addr, self.pointer);
        match b.len() {
            8 => Some(u64::from_ne_bytes(b.try_into().ok()?)),
            4 => Some(u32::from_ne_bytes(b.try_into().ok()?) as u64),
            _ => None,
        }
    }
}

/// Bytes read from `pid`'s memory at `addr` into `buf` (0 on error).
fn read_remote(pid: u32, addr: u64, buf: &mut [u8]) -> usize {
    let local = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: buf.len() };
    // SAFETY: `local` covers `buf`, which outlives the call; the kernel
    // checks `remote` against the other process's mappings.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    n.max(0) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_comes_before_the_c_library() {
        let maps = "55d0a000-55d0b000 r--p 00000000 fd:01 1311 /usr/bin/python3.11\n\
                    7f00-7f10 r--p 00000000 fd:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f10-7f20 r-xp 00028000 fd:01 77 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
                    7f80-7f90 rw-p 00000000 00:00 0 \n";
        let maps = parse_maps(maps);
        let c = candidates(&maps, "/usr/bin/python3.11");
        assert_eq!(
            c.iter().map(|m| m.path.as_str()).collect::<Vec<_>>(),
            ["/usr/bin/python3.11", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
        );
        assert_eq!((c[1].start, c[1].inode, c[1].dev.as_str()), (0x7f00, 77, "fd:01"));
    }

    /// Reads this test process's own environment after it changed it: what
    /// `setenv` put there is found; a name not listed is never returned.
    #[test]
    fn what_a_process_set_after_start_is_read_from_its_memory() {
        // A child of our own, so the test sets nothing in the test runner.
        let mut child = std::process::Command::new("python3")
            .args([
                "-c",
                "import os, sys, time\n\
                 os.environ['RANK'] = '3'\n\
                 os.environ['MASTER_ADDR'] = 'node-7'\n\
                 os.environ['SECRET_TOKEN'] = 'hunter2'\n\
                 print('set', flush=True)\n\
                 time.sleep(30)",
            ])
            .env_remove("RANK")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line)
            .unwrap();
        assert_eq!(line.trim(), "set");
        let read = EnvironReader::default().read(child.id());
        let exec = fs::read(format!("/proc/{}/environ", child.id())).unwrap();
        let _ = child.kill();
        let _ = child.wait();
        let read = read.expect("the live environment");
        let text = String::from_utf8(read).unwrap();
        assert!(text.split('\0').any(|e| e == "RANK=3"), "{text:?}");
        assert!(text.split('\0').any(|e| e == "MASTER_ADDR=node-7"), "{text:?}");
        assert!(!text.contains("hunter2") && !text.contains("SECRET"), "{text:?}");
        assert!(!String::from_utf8_lossy(&exec).contains("RANK=3"), "exec-time environment changed");
    }

    #[test]
    fn an_unreadable_process_reads_as_none() {
        assert_eq!(EnvironReader::default().read(u32::MAX >> 1), None);
    }
}

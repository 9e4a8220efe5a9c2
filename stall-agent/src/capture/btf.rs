//! The running kernel's BTF (/sys/kernel/btf/vmlinux): where the
//! `task_struct` fields the scheduler and task programs read sit, and
//! which BPF helpers the kernel has. Read once at start-up (with
//! `btfparse`), handed to the programs in the load-time config, like the
//! syscall register layout.
use std::path::Path;

use btfparse::{Offset, Readable, TypeInformation, TypeVariant};
use stall_common::{task_flags, TaskOffsets};

use super::CaptureError;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// x86-64's `THREAD_SIZE` (16 KiB: 4 pages, without KASAN's doubling):
/// `task_pt_regs(task)` is `task->stack + THREAD_SIZE - sizeof(pt_regs)`
/// on the kernels that lack `bpf_task_pt_regs` (before 5.15).
#[cfg(target_arch = "x86_64")]
const THREAD_SIZE: u32 = 16 << 10;

/// The whole BTF blob in memory: sysfs files answer small reads slowly.
struct Blob(Vec<u8>);

impl Readable for Blob {
    fn read(&self, offset: u64, buffer: &mut [u8]) -> btfparse::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        match start.checked_add(buffer.len()).and_then(|end| self.0.get(start..end)) {
            Some(src) => {
                buffer.copy_from_slice(src);
                Ok(())
            }
            None => {
                Err(btfparse::Error::new(btfparse::ErrorKind::IOError, "read past the end of the BTF data"))
            }
        }
    }
}

pub struct KernelBtf {
    types: TypeInformation,
}

impl KernelBtf {
    /// The running kernel's BTF; a kernel built without
    /// CONFIG_DEBUG_INFO_BTF has none.
    pub fn open() -> Result<Self, CaptureError> {
        Self::from_path(Path::new(VMLINUX))
    }

    pub fn from_path(path: &Path) -> Result<Self, CaptureError> {
        let data = std::fs::read(path).map_err(|_| CaptureError::NoBtf)?;
        Self::from_bytes(data)
    }

    pub fn from_bytes(data: Vec<u8>) -> Result<Self, CaptureError> {
        let types = TypeInformation::new(&Blob(data)).map_err(|_| CaptureError::NoBtf)?;
        Ok(Self { types })
    }

    /// The id of the struct named `name` (not a forward declaration).
    fn struct_id(&self, name: &str) -> Option<u32> {
        let id = self.types.id_of(name)?;
        if matches!(self.types.from_id(id)?, TypeVariant::Struct(_)) {
            return Some(id);
        }
        // id_of keeps the last type of that name; look for the struct itself.
        self.types
            .get()
            .iter()
            .find(|(id, t)| {
                matches!(t, TypeVariant::Struct(_)) && self.types.name_of(**id).as_deref() == Some(name)
            })
            .map(|(id, _)| *id)
    }

    /// Byte offset and size of `path` (`se.sum_exec_runtime`: members of
    /// members, anonymous unions looked through) in struct `strukt`.
    pub fn field(&self, strukt: &str, path: &str) -> Option<(u32, usize)> {
        let id = self.struct_id(strukt)?;
        let (tid, off) = self.types.offset_of(id, path).ok()?;
        let Offset::ByteOffset(off) = off else { return None };
        Some((off, self.types.size_of(tid).ok()?))
    }

    /// Size of struct `name`.
    pub fn struct_size(&self, name: &str) -> Option<usize> {
        self.types.size_of(self.struct_id(name)?).ok()
    }

    /// The `task_struct` offsets the programs need. `regs_from_stack`: the
    /// kernel lacks `bpf_task_pt_regs`, so the saved registers are found
    /// from `task->stack`, and that field is needed too.
    pub fn task_offsets(&self, regs_from_stack: bool) -> Result<TaskOffsets, CaptureError> {
        let need = |path: &str, size: &[usize]| -> Result<u32, CaptureError> {
            match self.field("task_struct", path) {
                Some((off, n)) if size.contains(&n) => Ok(off),
                _ => Err(CaptureError::MissingKernelField { field: format!("task_struct.{path}") }),
            }
        };
        // 5.14 renamed `long state` to `unsigned int __state`.
        let state = need("__state", &[4]).or_else(|_| need("state", &[8, 4])).map_err(|_| {
            CaptureError::MissingKernelField { field: "task_struct.__state (or state)".into() }
        })?;
        let mut flags = 0;
        let run_delay = match self.field("task_struct", "sched_info.run_delay") {
            Some((off, 8)) => {
                flags |= task_flags::RUN_DELAY;
                off
            }
            _ => 0,
        };
        let (stack, regs_in_stack) = if regs_from_stack {
            flags |= task_flags::REGS_FROM_STACK;
            let regs = self
                .struct_size("pt_regs")
                .ok_or_else(|| CaptureError::MissingKernelField { field: "struct pt_regs".into() })?;
            (need("stack", &[8])?, THREAD_SIZE - regs as u32)
        } else {
            (0, 0)
        };
        Ok(TaskOffsets {
            pid: need("pid", &[4])?,
            tgid: need("tgid", &[4])?,
            state,
            exit_state: need("exit_state", &[4])?,
            sum_exec: need("se.sum_exec_runtime", &[8])?,
            run_delay,
            stack,
            regs_in_stack,
            flags,
            _pad: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The running kernel's BTF, where there is one (the unit tests run
    /// anywhere; the integration tests check every kernel they boot).
    #[test]
    fn finds_task_fields_on_this_kernel() {
        let Ok(btf) = KernelBtf::open() else { return };
        for stack in [false, true] {
            let o = btf.task_offsets(stack).unwrap();
            assert!(o.pid > 0 && o.tgid == o.pid + 4, "{o:?}");
            assert!(o.sum_exec > 0 && o.state < o.pid, "{o:?}");
            assert_eq!(o.regs_in_stack != 0, stack);
        }
        assert_eq!(btf.struct_size("pt_regs"), Some(168));
        assert_eq!(btf.field("task_struct", "se.nope"), None);
        assert_eq!(btf.field("no_such_struct", "x"), None);
    }

    #[test]
    fn garbage_is_no_btf() {
        assert!(matches!(KernelBtf::from_bytes(vec![1, 2, 3]), Err(CaptureError::NoBtf)));
        assert!(matches!(KernelBtf::from_path(Path::new("/nonexistent/btf")), Err(CaptureError::NoBtf)));
    }
}

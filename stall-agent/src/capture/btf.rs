//! The running kernel's BTF (/sys/kernel/btf/vmlinux): where the
//! `task_struct` fields the scheduler and task programs read sit. Read once
//! at start-up and handed to the programs in the load-time config, like the
//! syscall register layout.
//!
//! A small reader of its own (the format is the kernel's
//! Documentation/bpf/btf.rst): one pass records where each type starts,
//! then only the structs on a path are decoded. Full parsers (btfparse)
//! build a map of every type's name and members: about 0.3 s and 60 MB
//! here for vmlinux, several seconds under the test VMs' emulation, where
//! attaching to a short-lived process then came too late. aya-obj's parser
//! does not expose struct members; btf-rs is LGPL.
use std::path::Path;

use stall_common::{task_flags, PageCacheOffsets, TaskOffsets};

use super::CaptureError;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// x86-64's `THREAD_SIZE` (16 KiB: 4 pages, without KASAN's doubling):
/// `task_pt_regs(task)` is `task->stack + THREAD_SIZE - sizeof(pt_regs)`,
/// where the programs find it without `bpf_task_pt_regs` (before 5.15, and
/// the cast switch).
#[cfg(target_arch = "x86_64")]
const THREAD_SIZE: u32 = 16 << 10;

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

/// A type's common header: name, kind, vlen, kind_flag, size or type.
#[derive(Debug, Clone, Copy)]
struct Head {
    name_off: u32,
    kind: u32,
    vlen: u32,
    kind_flag: bool,
    size_or_type: u32,
    /// Where its kind-specific data starts in `KernelBtf::types`.
    data: usize,
}

/// One argument of a tracepoint: a pointer (to the struct named, if it
/// points to one) or an integer of that many bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TpArg {
    Ptr(Option<String>),
    Int(usize),
}

pub struct KernelBtf {
    types: Vec<u8>,
    strings: Vec<u8>,
    /// Start of each type (id 1 at index 0) in `types`.
    starts: Vec<u32>,
}

impl KernelBtf {
    /// The running kernel's BTF; a kernel built without
    /// CONFIG_DEBUG_INFO_BTF has none.
    pub fn open() -> Result<Self, CaptureError> {
        Self::from_path(Path::new(VMLINUX))
    }

    pub fn from_path(path: &Path) -> Result<Self, CaptureError> {
        let data = std::fs::read(path).map_err(|_| CaptureError::NoBtf)?;
        Self::from_bytes(&data).ok_or(CaptureError::NoBtf)
    }

    /// Parses a little-endian BTF blob (as the kernel exports it).
    pub fn from_bytes(data: &[u8]) -> Option<Self> {
        let u16_at = |o: usize| Some(u16::from_le_bytes(data.get(o..o + 2)?.try_into().ok()?));
        let u32_at = |o: usize| Some(u32::from_le_bytes(data.get(o..o + 4)?.try_into().ok()?) as usize);
        if u16_at(0)? != MAGIC {
            return None;
        }
        let hdr_len = u32_at(4)?;
        let (type_off, type_len, str_off, str_len) = (u32_at(8)?, u32_at(12)?, u32_at(16)?, u32_at(20)?);
        let types = data.get(hdr_len + type_off..hdr_len + type_off + type_len)?.to_vec();
        let strings = data.get(hdr_len + str_off..hdr_len + str_off + str_len)?.to_vec();
        let mut btf = Self { types, strings, starts: Vec::new() };
        let mut at = 0;
        while at < btf.types.len() {
            btf.starts.push(u32::try_from(at).ok()?);
            let h = btf.head_at(at)?;
            let n = h.vlen as usize;
            let extra = match h.kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * n,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * n,
                0..=KIND_ENUM64 => 0,
                _ => return None,
            };
            at = h.data + extra;
        }
        Some(btf)
    }

    fn u32_at(&self, at: usize) -> Option<u32> {
        Some(u32::from_le_bytes(self.types.get(at..at + 4)?.try_into().ok()?))
    }

    fn head_at(&self, at: usize) -> Option<Head> {
        let info = self.u32_at(at + 4)?;
        Some(Head {
            name_off: self.u32_at(at)?,
            kind: (info >> 24) & 0x1f,
            vlen: info & 0xffff,
            kind_flag: info >> 31 == 1,
            size_or_type: self.u32_at(at + 8)?,
            data: at + 12,
        })
    }

    fn head(&self, id: u32) -> Option<Head> {
        let at = *self.starts.get(usize::try_from(id).ok()?.checked_sub(1)?)?;
        self.head_at(at as usize)
    }

    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|b| *b == 0).unwrap_or(rest.len())]
    }

    /// Follows typedefs and qualifiers to the type they name.
    fn resolve(&self, mut id: u32) -> Option<(u32, Head)> {
        for _ in 0..32 {
            let h = self.head(id)?;
            match h.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = h.size_or_type
                }
                _ => return Some((id, h)),
            }
        }
        None
    }

    fn size(&self, id: u32) -> Option<usize> {
        let (_, h) = self.resolve(id)?;
        match h.kind {
            KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 => Some(h.size_or_type as usize),
            KIND_PTR => Some(8),
            KIND_ARRAY => {
                let elem = self.u32_at(h.data)?;
                let n = self.u32_at(h.data + 8)? as usize;
                Some(self.size(elem)? * n)
            }
            _ => None,
        }
    }

    /// The id of the struct named `name`.
    pub fn struct_id(&self, name: &str) -> Option<u32> {
        self.id_of(KIND_STRUCT, name)
    }

    /// The id of the function named `name` (a kfunc is called by it).
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.id_of(KIND_FUNC, name)
    }

    fn id_of(&self, kind: u32, name: &str) -> Option<u32> {
        (1..=self.starts.len() as u32).find(|id| {
            self.head(*id).is_some_and(|h| h.kind == kind && self.name(h.name_off) == name.as_bytes())
        })
    }

    /// (bit offset, type) of member `name` of struct or union `h`, looking
    /// through anonymous members (`union { ... }` inside `task_struct`).
    fn member(&self, h: &Head, name: &[u8]) -> Option<(u32, u32)> {
        for i in 0..h.vlen as usize {
            let at = h.data + 12 * i;
            let (m_name, m_type, m_off) = (self.u32_at(at)?, self.u32_at(at + 4)?, self.u32_at(at + 8)?);
            let bits = if h.kind_flag { m_off & 0xff_ffff } else { m_off };
            if m_name != 0 {
                if self.name(m_name) == name {
                    return Some((bits, m_type));
                }
                continue;
            }
            let Some((_, inner)) = self.resolve(m_type) else { continue };
            if matches!(inner.kind, KIND_STRUCT | KIND_UNION) {
                if let Some((b, t)) = self.member(&inner, name) {
                    return Some((bits + b, t));
                }
            }
        }
        None
    }

    /// Byte offset and size of `path` (`se.sum_exec_runtime`: members of
    /// members, anonymous unions looked through) in struct `strukt`.
    pub fn field(&self, strukt: &str, path: &str) -> Option<(u32, usize)> {
        let mut id = self.struct_id(strukt)?;
        let mut bits = 0;
        for part in path.split('.') {
            let (_, h) = self.resolve(id)?;
            if !matches!(h.kind, KIND_STRUCT | KIND_UNION) {
                return None;
            }
            let (b, t) = self.member(&h, part.as_bytes())?;
            bits += b;
            id = t;
        }
        if bits % 8 != 0 {
            return None;
        }
        Some((bits / 8, self.size(id)?))
    }

    /// Byte offset of `path` in struct `strukt`, if it is one of `sizes`
    /// bytes long (what the program reads it as).
    pub fn offset(&self, strukt: &str, path: &str, sizes: &[usize]) -> Option<u32> {
        self.field(strukt, path).filter(|(_, n)| sizes.contains(n)).map(|(off, _)| off)
    }

    /// How many parameters each of `names` takes by its prototype in BTF
    /// (None: no such function), in the order given. One pass over the types.
    pub fn func_params(&self, names: &[&str]) -> Vec<Option<u32>> {
        let mut found = vec![None; names.len()];
        for id in 1..=self.starts.len() as u32 {
            let Some(h) = self.head(id) else { break };
            if h.kind != KIND_FUNC {
                continue;
            }
            let name = self.name(h.name_off);
            for (i, n) in names.iter().enumerate() {
                if n.as_bytes() == name {
                    found[i] =
                        self.head(h.size_or_type).filter(|p| p.kind == KIND_FUNC_PROTO).map(|p| p.vlen);
                }
            }
        }
        found
    }

    /// A raw tracepoint's arguments, from its BTF typedef `btf_trace_<event>`
    /// (`void (*)(void *data, args...)`), the data pointer left out. None:
    /// no such tracepoint in BTF.
    pub fn tracepoint_args(&self, event: &str) -> Option<Vec<TpArg>> {
        let name = format!("btf_trace_{event}");
        let id = (1..=self.starts.len() as u32).find(|id| {
            self.head(*id).is_some_and(|h| h.kind == KIND_TYPEDEF && self.name(h.name_off) == name.as_bytes())
        })?;
        let (_, ptr) = self.resolve(self.head(id)?.size_or_type)?;
        let (_, proto) = self.resolve(ptr.size_or_type).filter(|_| ptr.kind == KIND_PTR)?;
        if proto.kind != KIND_FUNC_PROTO {
            return None;
        }
        let mut args = Vec::new();
        for i in 1..proto.vlen as usize {
            let ty = self.u32_at(proto.data + 8 * i + 4)?;
            let (_, h) = self.resolve(ty)?;
            args.push(match h.kind {
                KIND_PTR => {
                    let pointee = self.resolve(h.size_or_type).filter(|(_, p)| p.kind == KIND_STRUCT);
                    TpArg::Ptr(
                        pointee.map(|(_, p)| String::from_utf8_lossy(self.name(p.name_off)).into_owned()),
                    )
                }
                _ => TpArg::Int(self.size(ty).unwrap_or(0)),
            });
        }
        Some(args)
    }

    /// Size of struct `name`.
    pub fn struct_size(&self, name: &str) -> Option<usize> {
        self.size(self.struct_id(name)?)
    }

    /// The value of enumerator `name` (`PG_head`), in whichever enum has it.
    pub fn enumerator(&self, name: &str) -> Option<i64> {
        for id in 1..=self.starts.len() as u32 {
            let h = self.head(id)?;
            let width = match h.kind {
                KIND_ENUM => 8,
                KIND_ENUM64 => 12,
                _ => continue,
            };
            for i in 0..h.vlen as usize {
                let at = h.data + width * i;
                if self.name(self.u32_at(at)?) == name.as_bytes() {
                    let lo = self.u32_at(at + 4)?;
                    return Some(if width == 8 {
                        i64::from(lo as i32)
                    } else {
                        (i64::from(self.u32_at(at + 8)?) << 32) | i64::from(lo)
                    });
                }
            }
        }
        None
    }

    /// Where a page-cache folio's file and size are; None where a field is
    /// missing (the page-cache fill program is then not attached).
    /// `whole_folios`: a fault maps each large folio of the page cache it
    /// reaches whole (6.18 on), not only its window's part.
    pub fn page_cache_offsets(&self, whole_folios: bool) -> Option<PageCacheOffsets> {
        // Large folios keep their order in the second page: `_folio_order`
        // (6.1, where `_flags_1` is that page's own flags), else the low byte
        // of `_flags_1` (6.6 on); 5.10 has no folios.
        let order_byte = self
            .offset("folio", "_folio_order", &[1])
            .or_else(|| self.offset("folio", "_flags_1", &[8]))
            .unwrap_or(0);
        let head_bit = match order_byte {
            0 => 0,
            _ => u32::try_from(self.enumerator("PG_head")?).ok().filter(|b| *b < 64)?,
        };
        Some(PageCacheOffsets {
            flags: self.offset("page", "flags", &[8])?,
            mapping: self.offset("page", "mapping", &[8])?,
            host: self.offset("address_space", "host", &[8])?,
            ino: self.offset("inode", "i_ino", &[8])?,
            sb: self.offset("inode", "i_sb", &[8])?,
            dev: self.offset("super_block", "s_dev", &[4])?,
            head_bit,
            order_byte,
            size: self.offset("inode", "i_size", &[8])?,
            ..self.folio_offsets(self.fault_offsets().unwrap_or_default(), whole_folios)
        })
    }

    /// Adds to `o` where the page cache's folios are found, where the
    /// kernel maps large folios whole on a fault (`whole_folios`).
    fn folio_offsets(&self, o: PageCacheOffsets, whole_folios: bool) -> PageCacheOffsets {
        if !whole_folios {
            return o;
        }
        let found = || {
            Some(PageCacheOffsets {
                xa_head: self.offset("address_space", "i_pages.xa_head", &[8])?,
                node_shift: self.offset("xa_node", "shift", &[1])?,
                node_slots: self.offset("xa_node", "slots", &[512])?,
                whole_folios: 1,
                ..o
            })
        };
        found().unwrap_or(o)
    }

    /// Where a `struct vm_fault *` leads to its file (the fault
    /// trampolines), in a `PageCacheOffsets` holding only those fields.
    fn fault_offsets(&self) -> Option<PageCacheOffsets> {
        Some(PageCacheOffsets {
            fault_vma: self.offset("vm_fault", "vma", &[8])?,
            fault_pgoff: self.offset("vm_fault", "pgoff", &[8])?,
            vma_file: self.offset("vm_area_struct", "vm_file", &[8])?,
            file_mapping: self.offset("file", "f_mapping", &[8])?,
            ..Default::default()
        })
    }

    /// The `task_struct` offsets the programs need. `regs_from_stack`: the
    /// kernel lacks `bpf_task_pt_regs`, so the saved registers are found
    /// from `task->stack`, and that field is needed too.
    pub fn task_offsets(&self, regs_from_stack: bool) -> Result<TaskOffsets, CaptureError> {
        let need = |path: &str, sizes: &[usize]| -> Result<u32, CaptureError> {
            self.offset("task_struct", path, sizes)
                .ok_or_else(|| CaptureError::MissingKernelField { field: format!("task_struct.{path}") })
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
        // Where a switch-in finds how long its task waited for a CPU; a
        // kernel without CFS groups has no `se.cfs_rq`.
        let queued = || {
            Some((
                self.offset("task_struct", "sched_info.last_queued", &[8])?,
                self.offset("task_struct", "se.cfs_rq", &[8])?,
                self.offset("cfs_rq", "rq", &[8])?,
                self.offset("rq", "clock", &[8])?,
                self.offset("rq", "curr", &[8])?,
            ))
        };
        if self.field("sched_entity", "sched_delayed").is_some() {
            flags |= task_flags::DELAYED_DEQUEUE;
        }
        let (last_queued, se_cfs_rq, cfs_rq_rq, rq_clock, rq_curr) = match queued() {
            Some(q) if flags & task_flags::RUN_DELAY != 0 => {
                flags |= task_flags::QUEUED_AT;
                q
            }
            _ => Default::default(),
        };
        // Where the user registers are from `task->stack`: needed before
        // 5.15, and by the cast switch (`sched_switch_queued_cast`).
        let regs = self
            .struct_size("pt_regs")
            .ok_or_else(|| CaptureError::MissingKernelField { field: "struct pt_regs".into() })?;
        let (stack, regs_in_stack) = (need("stack", &[8])?, THREAD_SIZE - regs as u32);
        if regs_from_stack {
            flags |= task_flags::REGS_FROM_STACK;
        }
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
            last_queued,
            se_cfs_rq,
            cfs_rq_rq,
            rq_clock,
            rq_curr,
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
            assert_eq!(o.regs_in_stack, THREAD_SIZE - 168, "{o:?}");
            assert_eq!(o.flags & task_flags::REGS_FROM_STACK != 0, stack, "{o:?}");
            // Every kernel the suites boot has CFS groups and sched_info;
            // from 6.12 on, delayed dequeues.
            let delayed = btf.field("sched_entity", "sched_delayed").is_some();
            assert_eq!(o.flags & task_flags::DELAYED_DEQUEUE != 0, delayed, "{o:?}");
            assert!(o.flags & task_flags::QUEUED_AT != 0, "{o:?}");
            assert!(o.last_queued > o.run_delay && o.se_cfs_rq > o.sum_exec, "{o:?}");
            assert!(o.rq_clock != o.rq_curr && o.cfs_rq_rq != 0, "{o:?}");
        }
        assert_eq!(btf.struct_size("pt_regs"), Some(168));
        assert_eq!(btf.field("task_struct", "se.nope"), None);
        assert_eq!(btf.field("no_such_struct", "x"), None);
        // Through an anonymous union: `sched_info.run_delay` (5.10 to 6.18),
        // and a member of a member.
        assert!(btf.field("task_struct", "sched_info.run_delay").is_some());
        assert_eq!(btf.field("list_head", "prev"), Some((8, 8)));
    }

    /// The page cache's fields on this kernel, where it has BTF (every
    /// kernel the VMs boot runs the integration tests that use them).
    #[test]
    fn finds_page_cache_fields_on_this_kernel() {
        let Ok(btf) = KernelBtf::open() else { return };
        let off = btf.page_cache_offsets(true).expect("page cache offsets");
        assert_eq!((off.flags, off.mapping), (0, 24), "{off:?}");
        assert!(off.head_bit < 64 && off.ino > 0 && off.dev > 0, "{off:?}");
        // `vm_fault.vma` and `.pgoff` sit in an anonymous const struct (5.11 on).
        assert!(off.size > 0 && off.vma_file > 0 && off.file_mapping > 0, "{off:?}");
        assert!(off.fault_pgoff > off.fault_vma, "{off:?}");
        assert!(
            off.whole_folios == 1 && off.xa_head > off.host && off.node_slots > off.node_shift,
            "{off:?}"
        );
        assert_eq!(btf.page_cache_offsets(false).unwrap().whole_folios, 0);
        assert!(btf.enumerator("PG_locked") == Some(0));
    }

    /// Function prototypes: the syscall wrappers take the saved registers.
    #[test]
    fn finds_function_parameters_on_this_kernel() {
        let Ok(btf) = KernelBtf::open() else { return };
        let got = btf.func_params(&["__x64_sys_read", "vfs_read", "no_such_function_here", "__x64_sys_read"]);
        assert_eq!(got, [Some(1), Some(4), None, Some(1)]);
    }

    /// A hand-made blob: struct s { int a; union { long b; }; } with a
    /// typedef and a const in the way.
    #[test]
    fn reads_a_small_blob() {
        let strings = b"\0s\0a\0b\0int\0long\0".to_vec();
        let mut types = Vec::new();
        let mut ty = |name: u32, kind: u32, vlen: u32, st: u32, extra: &[u32]| {
            for v in [name, kind << 24 | vlen, st].iter().chain(extra) {
                types.extend_from_slice(&v.to_le_bytes());
            }
        };
        ty(7, KIND_INT, 0, 4, &[32]); // 1: int
        ty(11, KIND_INT, 0, 8, &[64]); // 2: long
        ty(0, KIND_CONST, 0, 2, &[]); // 3: const long
        ty(0, KIND_UNION, 1, 8, &[5, 3, 0]); // 4: union { const long b; }
        ty(1, KIND_STRUCT, 2, 16, &[3, 1, 0, 0, 4, 64]); // 5: struct s
        let mut blob = Vec::new();
        for v in [0xeb9f_u16.to_le_bytes().to_vec(), vec![1, 0], 24u32.to_le_bytes().to_vec()] {
            blob.extend(v);
        }
        for v in [0, types.len() as u32, types.len() as u32, strings.len() as u32] {
            blob.extend_from_slice(&v.to_le_bytes());
        }
        blob.extend(&types);
        blob.extend(&strings);
        let btf = KernelBtf::from_bytes(&blob).unwrap();
        assert_eq!(btf.field("s", "a"), Some((0, 4)));
        assert_eq!(btf.field("s", "b"), Some((8, 8)));
        assert_eq!(btf.field("s", "c"), None);
        assert_eq!(btf.struct_size("s"), Some(16));
    }

    #[test]
    fn garbage_is_no_btf() {
        assert!(KernelBtf::from_bytes(&[1, 2, 3]).is_none());
        assert!(KernelBtf::from_bytes(&[0x9f, 0xeb, 1, 0, 24, 0, 0, 0, 0, 0, 0, 0, 99, 0, 0, 0]).is_none());
        assert!(matches!(KernelBtf::from_path(Path::new("/nonexistent/btf")), Err(CaptureError::NoBtf)));
    }
}

//! The kernel object with its kfunc placeholders (`stall_common::kfunc`)
//! rewritten into calls of this kernel's kfuncs, by their ids in its BTF:
//! what libbpf does for `__ksym` externs, which aya 0.14 does not.
use object::{Object, ObjectSection, SectionKind};
use stall_common::kfunc::{PT_REGS_TYPE, RDONLY_CAST_CALL, TASK_STRUCT_TYPE};

use super::btf::KernelBtf;

const BPF_CALL: u8 = 0x85;
const BPF_ALU64_MOV_K: u8 = 0xb7;
const BPF_ALU_MOV_K: u8 = 0xb4;
/// `src_reg` of a call instruction naming a kfunc by its BTF id.
const BPF_PSEUDO_KFUNC_CALL: u8 = 2;
const INSN: usize = 8;

/// This kernel's ids of what the placeholders stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KfuncIds {
    /// The function `bpf_rdonly_cast` (6.2).
    pub rdonly_cast: u32,
    /// The struct `pt_regs`.
    pub pt_regs: u32,
    /// The struct `task_struct`.
    pub task_struct: u32,
}

impl KfuncIds {
    /// None where the kernel's BTF lacks any of them.
    pub fn find(btf: &KernelBtf) -> Option<Self> {
        Some(Self {
            rdonly_cast: btf.func_id("bpf_rdonly_cast")?,
            pt_regs: btf.struct_id("pt_regs")?,
            task_struct: btf.struct_id("task_struct")?,
        })
    }
}

/// An ELF object in 8-aligned memory, as aya's parser wants it.
pub struct AlignedObject {
    words: Vec<u64>,
    len: usize,
}

impl AlignedObject {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `words` holds at least `len` initialised bytes, and u8 has
        // no alignment or validity requirement.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
}

/// How many instructions a rewrite changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rewritten {
    pub calls: usize,
    pub type_ids: usize,
}

/// A copy of `elf` whose code sections call the kfuncs `ids` names where
/// they called a placeholder.
pub fn rewrite(elf: &[u8], ids: KfuncIds) -> Result<(AlignedObject, Rewritten), String> {
    let ranges: Vec<(usize, usize)> = {
        let file = object::File::parse(elf).map_err(|e| format!("the kernel object does not parse: {e}"))?;
        file.sections()
            .filter(|s| s.kind() == SectionKind::Text)
            .filter_map(|s| s.file_range())
            .map(|(at, len)| (at as usize, len as usize))
            .collect()
    };
    let mut out = AlignedObject { words: vec![0; elf.len().div_ceil(8)], len: elf.len() };
    out.bytes_mut().copy_from_slice(elf);
    let mut done = Rewritten::default();
    let bytes = out.bytes_mut();
    for (at, len) in ranges {
        let code = bytes.get_mut(at..at + len).ok_or("a code section lies outside the object")?;
        for insn in code.chunks_exact_mut(INSN) {
            let imm = i32::from_le_bytes(insn[4..8].try_into().expect("4 bytes"));
            let src_reg = insn[1] >> 4;
            match insn[0] {
                BPF_CALL if src_reg == 0 && imm == RDONLY_CAST_CALL => {
                    insn[1] = BPF_PSEUDO_KFUNC_CALL << 4;
                    insn[2..4].copy_from_slice(&0i16.to_le_bytes()); // vmlinux, not a module
                    insn[4..8].copy_from_slice(&ids.rdonly_cast.to_le_bytes());
                    done.calls += 1;
                }
                BPF_ALU64_MOV_K | BPF_ALU_MOV_K if src_reg == 0 && imm == PT_REGS_TYPE => {
                    insn[4..8].copy_from_slice(&ids.pt_regs.to_le_bytes());
                    done.type_ids += 1;
                }
                BPF_ALU64_MOV_K | BPF_ALU_MOV_K if src_reg == 0 && imm == TASK_STRUCT_TYPE => {
                    insn[4..8].copy_from_slice(&ids.task_struct.to_le_bytes());
                    done.type_ids += 1;
                }
                _ => {}
            }
        }
    }
    Ok((out, done))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::object::BPF_OBJECT;

    fn insns(section: &[u8]) -> impl Iterator<Item = (u8, u8, i32)> + '_ {
        section.chunks_exact(INSN).map(|i| (i[0], i[1] >> 4, i32::from_le_bytes(i[4..8].try_into().unwrap())))
    }

    /// The placeholders are in `sys_exit_cast`, `sched_waking_checked` and
    /// `sched_switch_queued_cast` (and not in the programs loaded where the
    /// kernel lacks the kfunc); after the rewrite none is left and only the
    /// instructions that held them changed.
    #[test]
    fn placeholders_become_kfunc_calls_and_only_the_cast_program_holds_them() {
        use object::ObjectSymbol;
        assert!(!BPF_OBJECT.is_empty(), "built with STALL_BPF_STUB: no kernel object to check");
        let file = object::File::parse(BPF_OBJECT).unwrap();
        let placeholders = |prog: &str| {
            let sym = file.symbol_by_name(prog).unwrap_or_else(|| panic!("{prog} not in the object"));
            let section = file.section_by_index(sym.section_index().unwrap()).unwrap();
            let data = section.data().unwrap();
            let start = sym.address() as usize;
            let code = &data[start..start + sym.size() as usize];
            let calls =
                insns(code).filter(|&(op, src, imm)| op == BPF_CALL && src == 0 && imm == RDONLY_CAST_CALL);
            let of = |ty| insns(code).filter(|&(_, _, imm)| imm == ty).count();
            (calls.count(), of(PT_REGS_TYPE), of(TASK_STRUCT_TYPE))
        };
        use stall_common::names;
        for prog in [
            names::SYS_EXIT,
            names::SCHED_WAKING,
            names::SCHED_WAKING_MARKED,
            names::SCHED_SWITCH_QUEUED,
            names::SCHED_SWITCH_DIRECT,
        ] {
            assert_eq!(placeholders(prog), (0, 0, 0), "{prog}");
        }
        let (calls, regs, _) = placeholders(names::SYS_EXIT_CAST);
        assert!(calls >= 1 && regs >= 1, "sys_exit_cast: {calls} calls, {regs} pt_regs ids");
        let (waking_calls, _, tasks) = placeholders(names::SCHED_WAKING_CHECKED);
        assert!(
            waking_calls >= 1 && tasks >= 1,
            "sched_waking_checked: {waking_calls} calls, {tasks} task ids"
        );
        let (switch_calls, switch_regs, switch_tasks) = placeholders(names::SCHED_SWITCH_QUEUED_CAST);
        assert!(
            switch_calls >= 2 && switch_regs >= 1 && switch_tasks >= 1,
            "sched_switch_queued_cast: {switch_calls} calls, {switch_regs} pt_regs ids, {switch_tasks} task ids"
        );
        let (calls, type_ids) =
            (calls + waking_calls + switch_calls, regs + tasks + switch_regs + switch_tasks);

        let ids = KfuncIds { rdonly_cast: 4242, pt_regs: 77, task_struct: 78 };
        let (out, done) = rewrite(BPF_OBJECT, ids).unwrap();
        assert!(done.calls >= calls && done.type_ids >= type_ids, "{done:?}");
        assert_eq!(out.bytes().len(), BPF_OBJECT.len());
        let changed = out.bytes().chunks(INSN).zip(BPF_OBJECT.chunks(INSN)).filter(|(a, b)| a != b).count();
        assert_eq!(changed, done.calls + done.type_ids, "only the placeholders' instructions change");
        let rewritten = object::File::parse(out.bytes()).unwrap();
        let mut kfunc_calls = 0;
        for s in rewritten.sections().filter(|s| s.kind() == SectionKind::Text) {
            let data = s.data().unwrap();
            assert!(!insns(data)
                .any(|(_, _, imm)| [RDONLY_CAST_CALL, PT_REGS_TYPE, TASK_STRUCT_TYPE].contains(&imm)));
            kfunc_calls += insns(data)
                .filter(|&(op, src, imm)| op == BPF_CALL && src == BPF_PSEUDO_KFUNC_CALL && imm == 4242)
                .count();
        }
        assert_eq!(kfunc_calls, done.calls);
    }

    #[test]
    fn finds_the_ids_on_this_kernel_where_it_has_them() {
        let btf = KernelBtf::open().expect("kernel BTF (/sys/kernel/btf/vmlinux)");
        let ids = KfuncIds::find(&btf);
        // bpf_rdonly_cast is 6.2's: a kernel that has it has pt_regs.
        if btf.func_id("bpf_rdonly_cast").is_some() {
            let ids = ids.expect("both ids");
            assert!(ids.rdonly_cast != ids.pt_regs && ids.pt_regs != ids.task_struct, "{ids:?}");
        } else {
            assert_eq!(ids, None);
        }
    }
}

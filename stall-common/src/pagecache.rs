//! Where the page-cache programs find a folio's file and size, and a
//! fault's file (byte offsets the agent takes from BTF).

/// Where the page-cache fill program finds a filled folio's file and size
/// (byte offsets from BTF). `mapping == 0`: not found, the program is not
/// attached.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCacheOffsets {
    /// `page.flags` (a folio starts with its head page).
    pub flags: u32,
    /// `page.mapping`: the `address_space`.
    pub mapping: u32,
    /// `address_space.host`: the inode.
    pub host: u32,
    pub ino: u32,
    /// `inode.i_sb`, and `super_block.s_dev` in it.
    pub sb: u32,
    pub dev: u32,
    /// `PG_head`: the folio is large, its order is in `order_byte`.
    pub head_bit: u32,
    /// The byte holding a large folio's order (`_folio_order`, or the low
    /// byte of `_flags_1`); 0: folios are single pages here (5.10).
    pub order_byte: u32,
    /// `inode.i_size`: pages a fault window tried past the end are not
    /// counted.
    pub size: u32,
    /// Where the fault trampolines find the file of a `struct vm_fault *`
    /// (kernels without the `mm_filemap_*` fault tracepoints):
    /// `vm_fault.vma`, `vm_fault.pgoff`, `vm_area_struct.vm_file`,
    /// `file.f_mapping`; `file_mapping` 0: not found, the trampolines are
    /// not loaded.
    pub fault_vma: u32,
    pub fault_pgoff: u32,
    pub vma_file: u32,
    pub file_mapping: u32,
    /// Where the page cache's folio holding an index is found:
    /// `address_space.i_pages.xa_head`, `xa_node.shift`, `xa_node.slots`.
    pub xa_head: u32,
    pub node_shift: u32,
    pub node_slots: u32,
    /// Non-zero: a fault maps each large folio it reaches whole (6.18 on),
    /// not only the part inside its window.
    pub whole_folios: u32,
    pub _pad: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    // Sizes are fixed so a change on one side cannot silently desync the other.
    #[test]
    fn layouts_have_no_hidden_padding() {
        assert_eq!(size_of::<PageCacheOffsets>(), 72);
    }
}

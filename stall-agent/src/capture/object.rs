//! The kernel object as built, and its programs and maps by name.
use aya::{
    programs::{Program, ProgramError},
    Ebpf,
};

use super::{
    error::{load_err, map_err, program_load_err},
    CaptureError,
};

pub(super) static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("STALL_BPF_OBJ"));

/// A program of the object, loaded (`load` is the type's own).
pub(super) fn program<'a, T>(
    ebpf: &'a mut Ebpf,
    name: &str,
    load: fn(&mut T) -> Result<(), ProgramError>,
) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    let prog: &mut T = ebpf
        .program_mut(name)
        .ok_or_else(|| CaptureError::NotInObject(format!("program {name}")))?
        .try_into()
        .map_err(load_err)?;
    load(prog).map_err(|e| program_load_err(name, e))?;
    Ok(prog)
}

/// A program loaded at start-up, to attach or detach.
pub(super) fn attached_program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut Program, Error = ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| CaptureError::NotInObject(format!("program {name}")))?
        .try_into()
        .map_err(load_err)
}

pub(super) fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, CaptureError> {
    let map = ebpf.take_map(name).ok_or_else(|| CaptureError::NotInObject(format!("map {name}")))?;
    T::try_from(map).map_err(map_err(name))
}

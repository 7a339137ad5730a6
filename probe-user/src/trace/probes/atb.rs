//! ATB layout (spec §1.8 names the functions, not the objects; these are the offsets of the
//! simulated libatb.so, tests/fixtures/include/atb.h, built with the C++11 string ABI).

/// `atb::Tensor`: dtype (i32) at 0, format (i32) at 4, dims (8 x i64) at 8, dimNum at 72,
/// deviceData at 80, dataSize at 96.
pub const TENSOR_SIZE: u32 = 104;
pub const TENSOR_DIMS: usize = 8;
pub const TENSOR_DIM_NUM: usize = 72;
pub const TENSOR_DEVICE_DATA: usize = 80;
pub const TENSOR_DATA_SIZE: usize = 96;
/// Tensors per CHUNK event (2 x 104 bytes).
pub const TENSORS_PER_CHUNK: u32 = 2;
/// `SVector<T>`: data pointer at 0, element count at 8.
pub const SVECTOR_DATA: u32 = 0;
pub const SVECTOR_SIZE: u32 = 8;
/// `RunnerVariantPack`: inTensors at 0, outTensors at 24, workspaceBuffer at 64,
/// workspaceBufferSize at 72, intermediateBufferSize at 88; 104 bytes are copied.
pub const PACK_IN: u32 = 0;
pub const PACK_OUT: u32 = 24;
pub const PACK_WORKSPACE: usize = 64;
pub const PACK_WORKSPACE_SIZE: usize = 72;
pub const PACK_INTERMEDIATE_SIZE: usize = 88;
pub const PACK_COPY: u32 = 104;
/// `Runner`: the character pointers of `name_` (at 8) and `saveTensorDir_` (at 40). The
/// first word of a `std::string` points to its characters in both string ABIs.
pub const RUNNER_NAME: u32 = 8;
pub const RUNNER_DIR: u32 = 40;
/// `Mki::LaunchParam`: inTensors at 0, outTensors at 24.
pub const PARAM_IN: u32 = 0;
pub const PARAM_OUT: u32 = 24;
/// Longest name or path read (bytes, with the NUL).
pub const STRING_MAX: u32 = 127;
pub const EXECUTE: &str = "_ZN3atb6Runner7ExecuteERNS_17RunnerVariantPackE";
pub const SAVE_LAUNCH_PARAM_ABI1: &str = "_ZN3atb9StoreUtil15SaveLaunchParamEPvRKN3Mki11LaunchParamERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";
pub const SAVE_LAUNCH_PARAM_ABI0: &str =
    "_ZN3atb9StoreUtil15SaveLaunchParamEPvRKN3Mki11LaunchParamERKSs";

use super::ProbeId;

/// What an ATB probe captures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtbPart {
    Name,
    Dir,
    Pack,
    End,
    Tensors { output: bool, after: bool },
    KernelDir,
    KernelTensors { output: bool },
}

pub fn atb_part(id: ProbeId) -> Option<AtbPart> {
    use AtbPart::*;
    Some(match id {
        ProbeId::AtbRunnerName => Name,
        ProbeId::AtbRunnerDir => Dir,
        ProbeId::AtbRunnerPack => Pack,
        ProbeId::AtbRunnerEnd => End,
        ProbeId::AtbInBefore => Tensors {
            output: false,
            after: false,
        },
        ProbeId::AtbOutBefore => Tensors {
            output: true,
            after: false,
        },
        ProbeId::AtbInAfter => Tensors {
            output: false,
            after: true,
        },
        ProbeId::AtbOutAfter => Tensors {
            output: true,
            after: true,
        },
        ProbeId::AtbKernelDir | ProbeId::AtbKernelDirAbi0 => KernelDir,
        ProbeId::AtbKernelIn | ProbeId::AtbKernelInAbi0 => KernelTensors { output: false },
        ProbeId::AtbKernelOut | ProbeId::AtbKernelOutAbi0 => KernelTensors { output: true },
        _ => return None,
    })
}

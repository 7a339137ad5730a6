//! Stage 2, interpreting what BPF sent: ring-buffer records decoded into calls ([`decode`]),
//! and the vendor meaning of those calls: HAL flags and devices ([`hal`]), ATB operator packs
//! ([`atb`]), framework pools ([`pools`]; MindSpore's seen from outside, [`mindspore`]), CUDA's runtime
//! and c10's allocator report ([`cuda`]), decompose labels ([`labels`]), kernel names
//! ([`kernels`]), C stacks ([`stacks`], resolved off the hot path) and Python stacks
//! ([`pystacks`], read from outside the process).
//!
//! Uses `trace` (probe ids and the probe table: what a record means) and `log`. Never
//! `state`, `session`, `analysis` or `output` (tests/layout.rs checks it).

pub mod atb;
pub mod cuda;
pub mod decode;
pub mod hal;
pub mod kernels;
pub mod labels;
pub mod mindspore;
pub mod pools;
pub mod pystacks;
pub mod stacks;

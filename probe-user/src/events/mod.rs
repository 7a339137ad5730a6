//! Interpreting what BPF sent: records decoded into calls, and the vendor semantics of those
//! calls (HAL flags, ATB packs, pools, labels, kernel names, C and Python stacks).

pub mod aclnn;
pub mod atb;
pub mod decode;
pub mod hal;
pub mod kernels;
pub mod labels;
pub mod pools;
pub mod pystacks;
pub mod stacks;

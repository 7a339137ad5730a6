//! The op API: every operator a framework runs on an NPU goes through a pair of exported C
//! functions of the op libraries (`libopapi.so`, `libopapi_*.so`, `libaclnn_*.so`):
//! `aclnnXGetWorkspaceSize(..., uint64_t *workspaceSize, aclOpExecutor **executor)`, then
//! `aclnnX(void *workspace, uint64_t workspaceSize, aclOpExecutor *executor, aclrtStream)`.
//! The second one runs the operator; it has the same signature for every X, so one probe spec
//! serves them all and the function is told apart by the attach cookie's upper bits (an index
//! into the names registered here). A release exports ~1,500 of them, attached through one
//! multi-uprobe link per library (`Bpf::attach_many`).
//!
//! This replaces msMemScope's ATen rows, which need its in-process Python collector: the
//! OP_LAUNCH rows are `ACLNN_START`/`ACLNN_END`, named after the function, with the workspace
//! the framework handed it (`workspace_addr`, `workspace_size`, and the `allocation_id` of the
//! pool block that holds it).

use std::{
    collections::HashMap,
    sync::{OnceLock, RwLock},
};

#[derive(Default)]
struct Registry {
    names: Vec<String>,
    index: HashMap<String, u32>,
}

fn registry() -> &'static RwLock<Registry> {
    static R: OnceLock<RwLock<Registry>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Most operator functions told apart (the cookie has 48 bits above the probe id; the event
/// carries 32 of them).
pub const MAX_OPS: usize = 1 << 20;

/// The index of an operator function (the same name in two libraries shares one).
pub fn register(name: &str) -> Option<u32> {
    let mut r = registry().write().unwrap_or_else(|e| e.into_inner());
    if let Some(i) = r.index.get(name) {
        return Some(*i);
    }
    if r.names.len() >= MAX_OPS {
        return None;
    }
    let i = r.names.len() as u32;
    r.names.push(name.to_owned());
    r.index.insert(name.to_owned(), i);
    Some(i)
}

/// The name registered under `index`.
pub fn name(index: u32) -> Option<String> {
    let r = registry().read().unwrap_or_else(|e| e.into_inner());
    r.names.get(index as usize).cloned()
}

/// The op libraries of a CANN install (the ones torch_npu loads by name), searched for ahead
/// of time like the vendor libraries.
pub const OP_LIBRARIES: [&str; 14] = [
    "libopapi.so",
    "libopapi_math.so",
    "libopapi_nn.so",
    "libopapi_cv.so",
    "libopapi_transformer.so",
    "libopapi_legacy.so",
    "libopapi_oam.so",
    "libaclnn_math.so",
    "libaclnn_ops_infer.so",
    "libaclnn_ops_train.so",
    "libaclnn_fft.so",
    "libaclnn_rand.so",
    "libaclnn_sparse.so",
    "libcust_opapi.so",
];

/// Op libraries by file name.
pub fn is_op_library(file_name: &str) -> bool {
    ["libopapi", "libaclnn_", "libcust_opapi"]
        .iter()
        .any(|p| file_name.starts_with(p))
        && file_name.contains(".so")
}

/// The functions that run an operator (not the workspace queries).
pub fn is_op_function(name: &str) -> bool {
    name.starts_with("aclnn") && name.len() > 5 && !name.ends_with("GetWorkspaceSize")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_libraries() {
        let add = register("aclnnAdd_test_only").unwrap();
        assert_eq!(register("aclnnAdd_test_only"), Some(add));
        assert_eq!(name(add).as_deref(), Some("aclnnAdd_test_only"));
        assert!(is_op_function("aclnnAdd") && !is_op_function("aclnnAddGetWorkspaceSize"));
        assert!(!is_op_function("aclnn") && !is_op_function("aclCreateTensor"));
        assert!(is_op_library("libopapi.so") && is_op_library("libaclnn_math.so"));
        assert!(!is_op_library("libascendcl.so") && !is_op_library("libopapi"));
        assert!(OP_LIBRARIES.iter().all(|l| is_op_library(l)));
    }
}

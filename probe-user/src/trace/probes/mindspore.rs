//! MindSpore's exported functions the tracer probes: its device memory pool
//! (`libmindspore_memory_pool.so`) and its pipeline's tasks (enqueued and started), by the
//! mangled names of the 2.10 release.

use super::{Home, ProbeDef, ProbeId, keeping, sf, spec};

pub const MINDSPORE_POOL_LIBRARY: &str = "libmindspore_memory_pool.so";
/// `void *AbstractDynamicMemPool::AllocTensorMem(size_t size, bool from_persistent_mem,
/// bool need_recycle, uint32_t stream_id)`.
pub const MS_ALLOC_TENSOR_MEM: &str =
    "_ZN9mindspore6device22AbstractDynamicMemPool14AllocTensorMemEmbbj";
/// `bool AbstractDynamicMemPool::DoFreeTensorMem(void *const &device_addr)`.
pub const MS_FREE_TENSOR_MEM: &str =
    "_ZN9mindspore6device22AbstractDynamicMemPool15DoFreeTensorMemERKPv";
/// MindSpore's pipeline queues (`AsyncRQueue`).
pub const MINDSPORE_PIPELINE_LIBRARY: &str = "libmindspore_runtime_pipeline.so";
/// `void AsyncRQueue::Push(const std::shared_ptr<AsyncTask> &task)`.
pub const MS_TASK_PUSH: &str =
    "_ZN9mindspore7runtime11AsyncRQueue4PushERKSt10shared_ptrINS0_9AsyncTaskEE";
/// The `Run()` of MindSpore 2.10's pipeline task classes (`AsyncTask` subclasses), by the
/// library that exports it. A worker thread calls the one of its task through the vtable;
/// the operator's output blocks are allocated inside `PyBoostDeviceTask::Run` on the
/// `backend_queue` thread (seen with gdb), after a `PyboostTask` on `frontend_queue`.
pub const MS_TASK_RUNS: [(&str, &str); 11] = [
    (
        "libmindspore_pynative.so",
        "_ZN9mindspore8pynative11PyboostTask3RunEv",
    ),
    (
        "libmindspore_pynative.so",
        "_ZN9mindspore8pynative12FrontendTask3RunEv",
    ),
    (
        "libmindspore_pynative.so",
        "_ZN9mindspore8pynative22ViewPyboostPromiseTask3RunEv",
    ),
    (
        "libmindspore_pynative.so",
        "_ZN9mindspore8pynative23PassthroughFrontendTask3RunEv",
    ),
    (
        "libmindspore_pynative_utils.so",
        "_ZN9mindspore7runtime15DeviceOpRunTask3RunEv",
    ),
    (
        "libmindspore_pynative_utils.so",
        "_ZN9mindspore7runtime16DeviceLaunchTask3RunEv",
    ),
    (
        "libmindspore_pynative_utils.so",
        "_ZN9mindspore7runtime17PyBoostDeviceTask3RunEv",
    ),
    (
        "libmindspore_pynative_utils.so",
        "_ZN9mindspore7runtime21PassthroughDeviceTask3RunEv",
    ),
    (
        "libmindspore_pynative_utils.so",
        "_ZN9mindspore7runtime27PassthroughNoWaitDeviceTask3RunEv",
    ),
    (
        MINDSPORE_PIPELINE_LIBRARY,
        "_ZN9mindspore7runtime12RunGraphTask3RunEv",
    ),
    (
        MINDSPORE_PIPELINE_LIBRARY,
        "_ZN9mindspore7runtime21BatchLaunchKernelTask3RunEv",
    ),
];

/// The `i`th of [`MS_TASK_RUNS`]: `this` (the task) at entry, no stack.
pub(super) const fn ms_task_run(i: usize) -> ProbeDef {
    let (lib, symbol) = MS_TASK_RUNS[i];
    ProbeDef {
        id: ProbeId::MsTaskRun,
        symbol,
        home: Home::Library(lib),
        spec: keeping(spec(sf::NO_STACK, 0, 0, 0), &[0]),
    }
}

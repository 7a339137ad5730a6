//! The user's site of an allocation: the line of the program's own code that asked for the
//! memory, which every leak, site and flame graph is attributed to.
//!
//! With a Python stack, the site is the innermost Python frame outside the framework's own
//! packages (torch, torch_npu, mindspore), the interpreter's standard library and memscope-bpf's helper
//! modules: `train.py:42`. Without one (or when every Python frame is the framework's), it is
//! the innermost C frame outside the vendor and framework libraries: the driver and runtime
//! entry points (`hal*`, `acl*`, `rt*`, `mstx*`, `drv*`), frames in the same source file as
//! such an entry point (their static helpers), and frames from the CANN, torch, torch_npu,
//! MindSpore and ATB trees or the C/C++ runtime.
//!
//! Allocator wrappers are passed too, as pprof's `-drop_frames` and memray's allocator
//! filtering do: a frame whose function name contains `alloc` (any case), or matches a
//! pattern given with `--drop-frames`, is skipped, so a leak through `my_npu_alloc()` is
//! attributed to the line that called it. When nothing but wrappers is left, the innermost
//! wrapper is the site.

pub const NO_STACK: &str = "[no call stack: trace with --call-stack=c]";
pub const NO_SITE: &str = "[only vendor frames]";

fn extra_drop() -> &'static [String] {
    crate::settings::drop_frames()
}

/// One parsed frame line of a `Call Stack(C)` (docs/call-stacks.md) or, in the mixed view, a
/// Python frame in it (`[python] function at file:line`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame<'a> {
    pub function: &'a str,
    /// `file:line`, when the frame was symbolized with a line.
    pub location: Option<&'a str>,
    pub file: Option<&'a str>,
    /// A Python frame of the mixed view.
    pub python: bool,
}

/// Parses one C-column line; `None` for blank lines and markers.
pub fn parse_frame(line: &str) -> Option<Frame<'_>> {
    let line = line.trim();
    if line.is_empty() || line == "[truncated]" {
        return None;
    }
    // "0x<16 hex> rest"
    let rest = match line.split_once(' ') {
        Some((a, r)) if a.starts_with("0x") => r,
        _ => line,
    };
    let rest = rest.strip_prefix("[inlined] ").unwrap_or(rest);
    let (rest, python) = match rest.strip_prefix("[python] ") {
        Some(r) => (r, true),
        None => (rest, false),
    };
    match rest.rsplit_once(" at ") {
        Some((f, loc)) => {
            let file = loc.rsplit_once(':').map(|(f, _)| f);
            Some(Frame {
                function: f,
                location: Some(loc),
                file,
                python,
            })
        }
        None => Some(Frame {
            function: rest,
            location: None,
            file: None,
            python,
        }),
    }
}

/// One parsed line of a `Call Stack(Python)`: `file(line): function`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyFrame<'a> {
    pub file: &'a str,
    /// The line, `?` when unknown.
    pub line: &'a str,
    pub function: &'a str,
}

impl PyFrame<'_> {
    /// `file:line`, the site's spelling.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// Parses one Python-column line; `None` for markers (`[python: ...]`, `[truncated]`).
pub fn parse_py_frame(line: &str) -> Option<PyFrame<'_>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('[') {
        return None;
    }
    let (head, function) = line.rsplit_once("): ")?;
    let (file, lineno) = head.rsplit_once('(')?;
    Some(PyFrame {
        file,
        line: lineno,
        function,
    })
}

const VENDOR_PREFIXES: [&str; 6] = ["hal", "acl", "rt", "mstx", "drv", "Mki::"];
const VENDOR_PATHS: [&str; 11] = [
    "/Ascend/",
    "/ascend-toolkit/",
    "/site-packages/torch/",
    "/site-packages/torch_npu/",
    "/site-packages/mindspore/",
    "torch_npu/csrc/",
    "c10/",
    "/atb/",
    "/include/c++/",
    "glibc",
    "/libc",
];
const VENDOR_MODULES: [&str; 10] = [
    "libascend",
    "libmindspore",
    "libacl",
    "libruntime",
    "libms_tools_ext",
    "libtorch",
    "libc10",
    "libatb",
    "libc.so",
    "libstdc++",
];
/// Python packages of the framework itself (and memscope-bpf's helpers the program imports).
const FRAMEWORK_PY_PATHS: [&str; 8] = [
    "/site-packages/torch/",
    "/site-packages/torch_npu/",
    "/site-packages/mindspore/",
    "/dist-packages/torch/",
    "/dist-packages/torch_npu/",
    "/dist-packages/mindspore/",
    "/memscope_steps.py",
    "/memscope_labels.py",
];

fn vendor_function(f: &str) -> bool {
    let name = f.split(['(', ' ', '<']).next().unwrap_or(f);
    VENDOR_PREFIXES.iter().any(|p| {
        name.starts_with(p)
            && name[p.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_uppercase() || c == '_' || p.ends_with("::"))
    }) || name.starts_with("at::")
        || name.starts_with("c10::")
        || name.starts_with("atb::")
        || name.starts_with("std::")
        || name.starts_with("__")
}

/// An allocator wrapper (or a frame `--drop-frames` names): passed over for its caller.
fn wrapper(function: &str, file: Option<&str>) -> bool {
    // The name without its parameters and namespaces: `ns::Pool::alloc(unsigned long)`.
    let base = function.split('(').next().unwrap_or(function);
    let base = base.rsplit("::").next().unwrap_or(base);
    base.to_ascii_lowercase().contains("alloc")
        || extra_drop()
            .iter()
            .any(|p| function.contains(p.as_str()) || file.is_some_and(|f| f.contains(p.as_str())))
}

/// A Python file of the framework or of the interpreter's standard library.
fn framework_py_file(file: &str) -> bool {
    if file.starts_with('<') {
        // `<frozen importlib._bootstrap>`, `<string>` is the program's own (exec).
        return file.starts_with("<frozen ");
    }
    if FRAMEWORK_PY_PATHS.iter().any(|p| file.contains(p)) {
        return true;
    }
    // The standard library: `.../lib/python3.11/x.py`, not its site-packages.
    match file.find("/lib/python3") {
        Some(at) => {
            let rest = &file[at..];
            !rest.contains("/site-packages/") && !rest.contains("/dist-packages/")
        }
        None => false,
    }
}

/// The innermost non-framework frame of a Python stack, wrappers passed over where a caller
/// is left.
pub fn python_site(py: &str) -> Option<String> {
    let frames: Vec<PyFrame> = py.lines().filter_map(parse_py_frame).collect();
    let user = |f: &&PyFrame| !framework_py_file(f.file);
    frames
        .iter()
        .filter(user)
        .find(|f| !wrapper(f.function, Some(f.file)))
        .or_else(|| frames.iter().find(user))
        .map(PyFrame::location)
}

/// The site of a C stack (which may hold the mixed view's Python frames): the `file:line` (or
/// the function, when no line is known) of the innermost frame outside vendor and framework
/// code, wrappers passed over where a caller is left.
pub fn c_site(stack: &str) -> Option<String> {
    let frames: Vec<Frame> = stack.lines().filter_map(parse_frame).collect();
    if frames.is_empty() {
        return None;
    }
    // A mixed stack: its Python frames say it best.
    let py_frames: Vec<PyFrame> = frames
        .iter()
        .filter(|f| f.python)
        .filter_map(|f| {
            let (file, line) = f.location?.rsplit_once(':')?;
            Some(PyFrame {
                file,
                line,
                function: f.function,
            })
        })
        .collect();
    let py_user = |f: &&PyFrame| !framework_py_file(f.file);
    if let Some(f) = py_frames
        .iter()
        .filter(py_user)
        .find(|f| !wrapper(f.function, Some(f.file)))
        .or_else(|| py_frames.iter().find(py_user))
    {
        return Some(f.location());
    }
    let vendor_files: Vec<&str> = frames
        .iter()
        .filter(|f| vendor_function(f.function))
        .filter_map(|f| f.file)
        .collect();
    let is_vendor = |f: &&Frame| {
        f.python
            || vendor_function(f.function)
            || f.file.is_some_and(|file| {
                vendor_files.contains(&file) || VENDOR_PATHS.iter().any(|p| file.contains(p))
            })
            || (f.location.is_none() && VENDOR_MODULES.iter().any(|m| f.function.starts_with(m)))
    };
    let site = frames
        .iter()
        .filter(|f| !is_vendor(f))
        .find(|f| !wrapper(f.function, f.file))
        .or_else(|| frames.iter().find(|f| !is_vendor(f)))?;
    Some(match site.location {
        Some(loc) => loc.to_owned(),
        None => site.function.to_owned(),
    })
}

/// The user's site of a block from its stacks (either may be empty): the Python line when
/// there is one, else the C site, else a marker saying why there is none.
pub fn user_site(c_stack: &str, py_stack: &str) -> String {
    if let Some(s) = python_site(py_stack) {
        return s;
    }
    if let Some(s) = c_site(c_stack) {
        return s;
    }
    if c_stack.trim().is_empty() && py_stack.lines().all(|l| parse_py_frame(l).is_none()) {
        NO_STACK.to_owned()
    } else {
        NO_SITE.to_owned()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A C stack through the simulated HAL (its entry point and a static helper) into a
    /// workload's frames; the report's tests use it too.
    pub(crate) const STACK: &str = "0x00007f0000001000 halMemAlloc at /src/tests/fixtures/src/hal.c:210\n\
        0x00007f0000001100 hal_pick at /src/tests/fixtures/src/hal.c:90\n\
        0x000055d0c0a01358 [inlined] leaf at /src/stack_workload.c:65\n\
        0x000055d0c0a01358 middle at /src/stack_workload.c:72\n\
        0x000055d0c0a0137d main at /src/stack_workload.c:99\n\
        0x00007f1e2c827249 __libc_start_call_main";

    #[test]
    fn c_site_is_the_innermost_frame_outside_vendor_code() {
        // hal_pick is in hal.c, where halMemAlloc lives: a vendor helper, skipped.
        assert_eq!(user_site(STACK, ""), "/src/stack_workload.c:65");
        assert_eq!(user_site("", ""), NO_STACK);
        assert_eq!(
            user_site("0x0000000000001000 halMemAlloc at /x/hal.c:3", ""),
            NO_SITE
        );
        assert_eq!(
            user_site(
                "0x0000000000001000 libascend_hal.so+0x1f0\n0x0000000000002000 app_fn",
                ""
            ),
            "app_fn"
        );
        // `rtos_init` is not a runtime entry point (`rt` + lower case).
        assert_eq!(
            user_site("0x0000000000001000 rtos_init at /app/r.c:4", ""),
            "/app/r.c:4"
        );
    }

    #[test]
    fn an_allocator_wrapper_gives_way_to_its_caller() {
        let s = "0x1 halMemAlloc at /x/hal.c:3\n\
                 0x2 npu_buffer_alloc at /app/pool.c:10\n\
                 0x3 ns::Arena::Allocate(unsigned long) at /app/arena.cc:20\n\
                 0x4 load_model at /app/main.c:44\n\
                 0x5 main at /app/main.c:90";
        assert_eq!(user_site(s, ""), "/app/main.c:44");
        // Only wrappers: the innermost one.
        let only = "0x1 halMemAlloc at /x/hal.c:3\n0x2 my_alloc at /app/pool.c:10";
        assert_eq!(user_site(only, ""), "/app/pool.c:10");
    }

    #[test]
    fn python_site_skips_the_framework_and_the_standard_library() {
        let py = "/v/lib/python3.11/site-packages/torch/nn/modules/linear.py(125): forward\n\
                  /v/lib/python3.11/site-packages/torch/nn/modules/module.py(1750): _call_impl\n\
                  /usr/lib/python3.11/contextlib.py(81): inner\n\
                  /home/u/train.py(42): step\n\
                  /home/u/train.py(90): <module>\n";
        assert_eq!(user_site(STACK, py), "/home/u/train.py:42");
        // A user package installed in site-packages is the user's code.
        let hf = "/v/lib/python3.11/site-packages/transformers/model.py(7): forward\n";
        assert_eq!(
            python_site(hf).as_deref(),
            Some("/v/lib/python3.11/site-packages/transformers/model.py:7")
        );
        // Only framework frames: the C site.
        let fw = "/v/lib/python3.11/site-packages/torch/functional.py(3): f\n";
        assert_eq!(user_site(STACK, fw), "/src/stack_workload.c:65");
        assert_eq!(
            user_site("", "[python: code object unreadable]\n"),
            NO_STACK
        );
    }

    #[test]
    fn mixed_stacks_are_read_through_their_python_frames() {
        let mixed = "0x1 halMemAlloc at /x/hal.c:3\n\
                     0x2 c10_npu::NPUCachingAllocator::malloc at torch_npu/csrc/a.cpp:9\n\
                     0x3 [python] forward at /v/site-packages/torch/nn/modules/linear.py:125\n\
                     0x3 [python] build at /home/u/train.py:17\n\
                     0x4 main at /usr/bin/python3:1";
        assert_eq!(user_site(mixed, ""), "/home/u/train.py:17");
    }
}

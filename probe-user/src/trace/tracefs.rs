//! tracefs: mounted on demand (aya attaches tracepoints through it) and read for the field
//! offsets of the tracepoints the BPF programs use, so a kernel that moves a field still works.

use std::{fs, path::Path};

use anyhow::{Context, Result, anyhow, bail};
use probe_common::TracepointOffsets;

const TRACEFS: &str = "/sys/kernel/tracing";

/// Makes sure tracefs is mounted at /sys/kernel/tracing (or debugfs' tracing dir exists).
pub fn ensure_mounted() -> Result<&'static Path> {
    for dir in [TRACEFS, "/sys/kernel/debug/tracing"] {
        if Path::new(dir).join("events").is_dir() {
            return Ok(Path::new(dir));
        }
    }
    let _ = fs::create_dir_all(TRACEFS);
    let src = c"nodev";
    let target = c"/sys/kernel/tracing";
    let fstype = c"tracefs";
    // SAFETY: constant NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        bail!(
            "tracefs is not mounted and mounting it at {TRACEFS} failed: {} \
             (mount it with `mount -t tracefs nodev {TRACEFS}`)",
            std::io::Error::last_os_error()
        );
    }
    Ok(Path::new(TRACEFS))
}

/// Reads the offsets the BPF programs need from the tracepoint format files.
pub fn read_offsets(root: &Path) -> Result<TracepointOffsets> {
    let field = |event: &str, name: &str| -> Result<u32> {
        let path = root.join("events").join(event).join("format");
        let text = fs::read_to_string(&path)
            .with_context(|| format!("cannot read tracepoint format {}", path.display()))?;
        field_offset(&text, name)
            .ok_or_else(|| anyhow!("field '{name}' not found in {}", path.display()))
    };
    Ok(TracepointOffsets {
        newtask_pid: field("task/task_newtask", "pid")?,
        newtask_clone_flags: field("task/task_newtask", "clone_flags")?,
        exec_filename_loc: field("sched/sched_process_exec", "filename")?,
        // Older kernels (6.12 on the arm64 VM) lack it: the main thread's exit stands in.
        exit_group_dead: field("sched/sched_process_exit", "group_dead")
            .unwrap_or(probe_common::NO_GROUP_DEAD),
        openat_dfd: field("syscalls/sys_enter_openat", "dfd")?,
        openat_filename: field("syscalls/sys_enter_openat", "filename")?,
        openat_flags: field("syscalls/sys_enter_openat", "flags")?,
        openat_ret: field("syscalls/sys_exit_openat", "ret")?,
        stop_on_discovery: 0,
        hold_vendor_opens: 0,
        capture_stacks: 0,
        python_stacks: 0,
    })
}

/// Finds `offset:N` on the line declaring field `name` (`field:<type> <name>;` or `<name>[...]`).
fn field_offset(format: &str, name: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let decl = line.trim().strip_prefix("field:")?;
        let decl = decl.split(';').next()?;
        let ident = decl.rsplit([' ', '*']).next()?;
        let ident = ident.split('[').next()?;
        if ident != name {
            return None;
        }
        let off = line.split("offset:").nth(1)?.split(';').next()?;
        off.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::{field_offset, read_offsets};

    #[test]
    fn parses_format_fields() {
        let fmt = "name: sched_process_exec\nformat:\n\
            \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
            \tfield:__data_loc char[] filename;\toffset:8;\tsize:4;\tsigned:0;\n\
            \tfield:pid_t pid;\toffset:12;\tsize:4;\tsigned:1;\n\
            \tfield:const char * filename2;\toffset:24;\tsize:8;\tsigned:0;\n\
            \tfield:char comm[16];\toffset:28;\tsize:16;\tsigned:0;\n";
        assert_eq!(field_offset(fmt, "filename"), Some(8));
        assert_eq!(field_offset(fmt, "pid"), Some(12));
        assert_eq!(field_offset(fmt, "filename2"), Some(24));
        assert_eq!(field_offset(fmt, "comm"), Some(28));
        assert_eq!(field_offset(fmt, "missing"), None);
    }

    /// A kernel before 6.16 (the arm64 VM's 6.12): `sched_process_exit` without `group_dead`
    /// gives the sentinel, every other field its offset.
    #[test]
    fn exit_without_group_dead_gives_the_sentinel() {
        let root = std::env::temp_dir().join(format!("memscope-tracefs-{}", std::process::id()));
        let field = |name: &str, off: u32| format!("\tfield:int {name};\toffset:{off};\tsize:4;\n");
        let events = [
            (
                "task/task_newtask",
                field("pid", 8) + &field("clone_flags", 16),
            ),
            ("sched/sched_process_exec", field("filename", 8)),
            (
                "sched/sched_process_exit",
                field("pid", 24) + &field("prio", 28),
            ),
            (
                "syscalls/sys_enter_openat",
                field("dfd", 16) + &field("filename", 24) + &field("flags", 32),
            ),
            ("syscalls/sys_exit_openat", field("ret", 16)),
        ];
        for (event, format) in &events {
            let dir = root.join("events").join(event);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("format"), format!("format:\n{format}")).unwrap();
        }
        let offsets = read_offsets(&root).unwrap();
        assert_eq!(offsets.exit_group_dead, probe_common::NO_GROUP_DEAD);
        assert_eq!(
            (offsets.newtask_clone_flags, offsets.openat_filename),
            (16, 24)
        );
        let exit = root.join("events/sched/sched_process_exit/format");
        std::fs::write(&exit, format!("format:\n{}", field("group_dead", 32))).unwrap();
        assert_eq!(read_offsets(&root).unwrap().exit_group_dead, 32);
        let _ = std::fs::remove_dir_all(&root);
    }
}

//! The stable text form of a symbolized stack, as written in the `Call Stack(C)` column.
//! The grammar is documented in `docs/call-stacks.md`; keep both in step.

use std::fmt::Write as _;

use crate::symbolize::Frame;

/// The line written after the frames when the stack is incomplete.
pub const TRUNCATED_MARKER: &str = "[truncated]";
/// The prefix of a frame that was inlined into the frame on the next line.
pub const INLINED_MARKER: &str = "[inlined]";

/// Formats one frame as one line (no newline).
pub fn format_frame(frame: &Frame) -> String {
    let mut s = format!("0x{:016x} ", frame.address);
    if frame.inlined {
        s.push_str(INLINED_MARKER);
        s.push(' ');
    }
    match (&frame.function, &frame.module) {
        (Some(function), _) => s.push_str(&one_line(function)),
        (None, Some(module)) if frame.file.is_none() => {
            let _ = write!(s, "{}+0x{:x}", one_line(module), frame.module_offset);
        }
        (None, _) if frame.file.is_some() => s.push_str("??"),
        (None, _) => s.push_str("[unknown]"),
    }
    if let Some(file) = &frame.file {
        let _ = write!(s, " at {}:{}", one_line(file), frame.line.unwrap_or(0));
    }
    s
}

/// Formats a stack innermost first, one frame per line, lines joined with `\n` (no trailing
/// newline), and a final `[truncated]` line when `truncated`.
pub fn format_stack(frames: &[Frame], truncated: bool) -> String {
    let mut lines: Vec<String> = frames.iter().map(format_frame).collect();
    if truncated {
        lines.push(TRUNCATED_MARKER.to_string());
    }
    lines.join("\n")
}

/// Names and paths never span lines.
fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_every_kind_of_frame() {
        let real = Frame {
            address: 0x7f12_a4c0_1234,
            module: Some("libhal.so".into()),
            module_offset: 0x1234,
            function: Some("halMemAlloc".into()),
            file: Some("/src/hal.c".into()),
            line: Some(120),
            inlined: false,
        };
        let inlined = Frame {
            function: Some("ns::helper<int>(int)".into()),
            file: Some("/src/util.h".into()),
            line: Some(33),
            inlined: true,
            ..real.clone()
        };
        let no_line = Frame {
            file: None,
            line: None,
            ..real.clone()
        };
        let unknown = Frame {
            function: None,
            file: None,
            line: None,
            ..real.clone()
        };
        let nowhere = Frame {
            address: 0x10,
            ..Frame::default()
        };
        let text = format_stack(&[inlined, real, no_line, unknown, nowhere], true);
        assert_eq!(
            text,
            "\
0x00007f12a4c01234 [inlined] ns::helper<int>(int) at /src/util.h:33
0x00007f12a4c01234 halMemAlloc at /src/hal.c:120
0x00007f12a4c01234 halMemAlloc
0x00007f12a4c01234 libhal.so+0x1234
0x0000000000000010 [unknown]
[truncated]"
        );
        assert_eq!(format_stack(&[], false), "");
    }
}

//! Unwinding and symbolizing real captured stacks of the `tests/data` fixtures, every frame
//! checked against binutils `addr2line -f -i -C`.

mod common;

use std::{collections::BTreeMap, path::PathBuf};

use common::{Capture, Fixture, RefFrame, Variant, addr2line, capture, fixture, vaddr_of};
use memscope_symbols::{
    Frame, ProcessView, Regs, StackSnapshot, StopReason, Symbolizer, SymbolizerOptions,
    UnwindOptions, Unwound, format_stack, unwind,
};

const DEPTH: u32 = 100;

fn symbolizer() -> Symbolizer {
    // The fixture's stripped library has no build-id file under /usr/lib/debug: its debug
    // file is found through its debuglink. System libraries use /usr/lib/debug when present.
    Symbolizer::with_options(SymbolizerOptions::default())
}

fn unwind_capture(
    c: &Capture,
    view: &ProcessView,
    sym: &Symbolizer,
    opts: UnwindOptions,
) -> Unwound {
    unwind(
        &Regs {
            pc: c.pc,
            sp: c.sp,
            fp: c.fp,
            lr: None,
        },
        &StackSnapshot {
            base: c.sp,
            data: &c.stack,
        },
        view,
        sym,
        &opts,
    )
}

fn base_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// Whitespace-insensitive comparison of function names (demanglers differ in spacing).
fn same_function(a: &str, b: &str) -> bool {
    let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
    squash(a) == squash(b)
}

/// Checks every frame of every pc against addr2line on the same module and address. Frames in
/// modules without debug info (the system libc) are compared where addr2line knows the answer.
/// Returns the names of the frames in fixture modules, innermost first.
fn check_against_addr2line(
    fx: &Fixture,
    view: &ProcessView,
    pcs: &[u64],
    frames: &[Frame],
) -> Vec<String> {
    // Group our frames by the pc they came from (frames of one pc share its address).
    let mut per_pc: Vec<Vec<&Frame>> = Vec::new();
    let mut i = 0;
    for &pc in pcs {
        let mut group = Vec::new();
        while i < frames.len() && frames[i].address == pc {
            group.push(&frames[i]);
            i += 1;
            if !group.last().unwrap().inlined {
                break;
            }
        }
        assert!(!group.is_empty(), "no frame for pc {pc:#x}");
        per_pc.push(group);
    }
    assert_eq!(i, frames.len());

    // Batch addr2line per module file.
    let mut by_module: BTreeMap<PathBuf, Vec<(usize, u64)>> = BTreeMap::new();
    for (n, &pc) in pcs.iter().enumerate() {
        let probe = if n == 0 { pc } else { pc - 1 };
        let loc = view.lookup(probe).expect("pc in a mapping");
        let path = loc.module().expect("pc in a file").path.clone();
        by_module
            .entry(path)
            .or_default()
            .push((n, vaddr_of(&loc.module().unwrap().path, loc.file_offset)));
    }
    let mut names = vec![String::new(); pcs.len()];
    let mut fixture_frame = vec![false; pcs.len()];
    let mut checked = 0;
    for (path, items) in by_module {
        let is_fixture = path.starts_with(&fx.dir);
        // The stripped library's DWARF is in its debug file: point addr2line at it.
        let reference = if path == fx.libmid {
            fx.libmid_debug.clone()
        } else {
            path.clone()
        };
        let addrs: Vec<u64> = items.iter().map(|(_, a)| *a).collect();
        let expected = addr2line(&reference, &addrs);
        assert_eq!(expected.len(), items.len());
        for ((n, addr), want) in items.iter().zip(expected) {
            let got = &per_pc[*n];
            fixture_frame[*n] = is_fixture;
            let known = want
                .iter()
                .any(|f| f.function.is_some() || f.file.is_some());
            if !is_fixture && !known {
                continue;
            }
            let ctx = || {
                format!(
                    "pc #{n} {:#x} = {}:{addr:#x}\n  ours: {got:#?}\n  addr2line: {want:#?}",
                    pcs[*n],
                    path.display()
                )
            };
            assert_eq!(got.len(), want.len(), "inline depth differs: {}", ctx());
            for (g, w) in got.iter().zip(&want) {
                let RefFrame {
                    function,
                    file,
                    line,
                } = w;
                match (function, &g.function) {
                    (Some(w), Some(g)) => {
                        assert!(same_function(w, g), "function differs: {}", ctx())
                    }
                    (Some(_), None) => panic!("function missing: {}", ctx()),
                    _ => {}
                }
                if !is_fixture {
                    // System libraries: binutils 2.40 maps some DWARF 5 file indexes of
                    // Debian's glibc to the wrong file (e.g. libc-start.c for a line of
                    // libc_start_call_main.h), so only names are compared there.
                    checked += 1;
                    continue;
                }
                assert_eq!(
                    file.as_deref().map(base_name),
                    g.file.as_deref().map(base_name),
                    "file differs: {}",
                    ctx()
                );
                assert_eq!(*line, g.line, "line differs: {}", ctx());
                checked += 1;
            }
            names[*n] = got
                .iter()
                .map(|f| {
                    let name = f.function.clone().unwrap_or_default();
                    if f.inlined {
                        format!("[inlined] {name}")
                    } else {
                        name
                    }
                })
                .collect::<Vec<_>>()
                .join(" / ");
        }
    }
    assert!(checked >= pcs.len().min(100));
    names
        .into_iter()
        .zip(fixture_frame)
        .filter_map(|(n, f)| f.then_some(n))
        .collect()
}

/// The fixture frames expected from `stackdump` at recursion `depth`, innermost first.
fn expected_chain(depth: u32) -> Vec<String> {
    let mut v = vec!["capture".to_string(), "[inlined] helper / leaf".to_string()];
    v.extend((0..=depth).map(|_| "recurse".to_string()));
    v.extend(
        [
            "mid_inner",
            "mid_call",
            "after_cxx",
            "int memscope_fixture::call_through<int>(int (*)(int), int)",
            "memscope_fixture::Walker<int>::run(int (*)(int), int)",
            "cxx_entry",
            "main",
        ]
        .map(String::from),
    );
    v
}

fn assert_chain(names: &[String], depth: u32) {
    let want = expected_chain(depth);
    assert_eq!(names.len(), want.len(), "fixture frames: {names:#?}");
    for (g, w) in names.iter().zip(&want) {
        assert!(
            same_function(g, w),
            "got {g:?}, want {w:?}\nall: {names:#?}"
        );
    }
}

fn full_check(variant: Variant) {
    let fx = fixture(variant);
    let c = capture(fx, "full", DEPTH);
    let view = ProcessView::from_maps_text(&c.maps);
    let sym = symbolizer();
    let unwound = unwind_capture(&c, &view, &sym, UnwindOptions::default());
    assert_eq!(
        unwound.stop,
        StopReason::Complete,
        "{variant:?}: {unwound:?}"
    );
    assert!(!unwound.truncated());
    assert_eq!(
        unwound.frame_pointer_steps, 0,
        "{variant:?}: CFI covers every frame"
    );
    let frames = sym.symbolize_stack(&view, &unwound.pcs);
    let mut names = check_against_addr2line(fx, &view, &unwound.pcs, &frames);
    // Beyond main: libc's start code, then the executable's `_start`, the outermost frame.
    assert_eq!(names.pop().as_deref(), Some("_start"));
    assert_chain(&names, DEPTH);
    assert!(unwound.pcs.len() > names.len() + 1);

    let text = format_stack(&frames, unwound.truncated());
    let first = text.lines().next().unwrap();
    assert!(
        first.starts_with(&format!("0x{:016x} capture at ", c.pc)),
        "{first}"
    );
    assert!(first.contains("stackdump.c:"));
    assert!(text.contains(" [inlined] helper at "));
    assert!(text.contains("memscope_fixture::Walker<int>::run("));
    assert!(!text.contains("[truncated]"));
}

#[test]
fn cfi_unwinds_frame_pointer_build() {
    full_check(Variant::FramePointers);
}

#[test]
fn cfi_unwinds_omit_frame_pointer_build() {
    full_check(Variant::NoFramePointers);
}

#[test]
fn cfi_unwinds_debug_frame_only_build() {
    full_check(Variant::DebugFrameOnly);
}

#[test]
fn frame_pointers_alone_unwind_the_frame_pointer_build() {
    let fx = fixture(Variant::FramePointers);
    let c = capture(fx, "fp", DEPTH);
    let view = ProcessView::from_maps_text(&c.maps);
    let sym = symbolizer();
    let fp_only = UnwindOptions {
        use_cfi: false,
        ..UnwindOptions::default()
    };
    let by_fp = unwind_capture(&c, &view, &sym, fp_only);
    let by_cfi = unwind_capture(&c, &view, &sym, UnwindOptions::default());
    assert!(by_fp.frame_pointer_steps > 0);
    // Up to main (libc has no frame pointers) the two agree exactly.
    let main_idx = expected_chain(DEPTH).len() - 1; // `[inlined] helper / leaf` is one pc
    assert!(by_fp.pcs.len() > main_idx, "{by_fp:?}");
    assert_eq!(by_fp.pcs[..=main_idx], by_cfi.pcs[..=main_idx]);
    let frames = sym.symbolize_stack(&view, &by_fp.pcs[..=main_idx]);
    let names = check_against_addr2line(fx, &view, &by_fp.pcs[..=main_idx], &frames);
    assert_chain(&names, DEPTH);
}

#[test]
fn frame_pointers_alone_fail_on_the_omit_frame_pointer_build() {
    let fx = fixture(Variant::NoFramePointers);
    let c = capture(fx, "nofp", DEPTH);
    let view = ProcessView::from_maps_text(&c.maps);
    let sym = symbolizer();
    let fp_only = UnwindOptions {
        use_cfi: false,
        ..UnwindOptions::default()
    };
    let by_fp = unwind_capture(&c, &view, &sym, fp_only);
    let by_cfi = unwind_capture(&c, &view, &sym, UnwindOptions::default());
    assert_eq!(by_cfi.stop, StopReason::Complete);
    assert!(
        by_fp.pcs.len() < by_cfi.pcs.len() / 2
            && by_fp.pcs[..] != by_cfi.pcs[..by_fp.pcs.len()].to_vec()[..]
            || by_fp.pcs.len() < 4,
        "frame pointers should not recover this stack: fp {by_fp:?}"
    );
}

#[test]
fn depth_limit_truncates_and_says_so() {
    let fx = fixture(Variant::NoFramePointers);
    let c = capture(fx, "deep", DEPTH);
    let view = ProcessView::from_maps_text(&c.maps);
    let sym = symbolizer();
    let opts = UnwindOptions {
        max_depth: 40,
        ..UnwindOptions::default()
    };
    let unwound = unwind_capture(&c, &view, &sym, opts);
    assert_eq!(unwound.pcs.len(), 40);
    assert_eq!(unwound.stop, StopReason::DepthLimit);
    assert!(unwound.truncated());
    let frames = sym.symbolize_stack(&view, &unwound.pcs);
    // Every frame of the truncated stack still matches addr2line.
    let names = check_against_addr2line(fx, &view, &unwound.pcs, &frames);
    assert_eq!(names.len(), 40);
    assert!(names[2..].iter().all(|n| n == "recurse"));
    let text = format_stack(&frames, unwound.truncated());
    assert_eq!(text.lines().last(), Some("[truncated]"));
    assert_eq!(text.lines().count(), 40 + 1 + 1); // + inlined helper + marker
}

#[test]
fn short_stack_copy_truncates_and_says_so() {
    let fx = fixture(Variant::NoFramePointers);
    let mut c = capture(fx, "short", DEPTH);
    c.stack.truncate(512);
    let view = ProcessView::from_maps_text(&c.maps);
    let sym = symbolizer();
    let unwound = unwind_capture(&c, &view, &sym, UnwindOptions::default());
    assert_eq!(unwound.stop, StopReason::OutsideSnapshot);
    assert!(unwound.truncated());
    assert!(
        unwound.pcs.len() > 3 && unwound.pcs.len() < 64,
        "{unwound:?}"
    );
    let frames = sym.symbolize_stack(&view, &unwound.pcs);
    check_against_addr2line(fx, &view, &unwound.pcs, &frames);
}

#[test]
fn each_object_is_parsed_once() {
    let fx = fixture(Variant::NoFramePointers);
    let c1 = capture(fx, "once1", 10);
    let c2 = capture(fx, "once2", 20);
    let sym = symbolizer();
    for c in [&c1, &c2] {
        let view = ProcessView::from_maps_text(&c.maps);
        let u = unwind_capture(c, &view, &sym, UnwindOptions::default());
        let _ = sym.symbolize_stack(&view, &u.pcs);
    }
    // stackdump, libmid, libcxx, libc (+ ld.so possibly): same objects in both runs.
    let stats = sym.stats();
    assert!(
        stats.objects_parsed >= 4 && stats.objects_parsed <= 8,
        "{stats:?}"
    );
    let again = sym.stats();
    assert_eq!(stats, again);
    let view = ProcessView::from_maps_text(&c1.maps);
    let u = unwind_capture(&c1, &view, &sym, UnwindOptions::default());
    let _ = sym.symbolize_stack(&view, &u.pcs);
    assert_eq!(sym.stats().objects_parsed, stats.objects_parsed);
}

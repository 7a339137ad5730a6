//! Heap profiles in pprof's `profile.proto` (gzipped), as `go tool pprof`, Pyroscope and Parca
//! read them: sample types `alloc_objects`, `alloc_space`, `inuse_objects`, `inuse_space`
//! (Go's order; `inuse_space` is the default), one sample per (process, stack).
//!
//! Frames come from the resolved stack text (`docs/call-stacks.md`: one frame per line,
//! innermost first, symbolized by `memscope_symbols`); each process adds an outermost frame
//! `<comm> (pid N)` so a node-wide profile keeps processes apart. The protobuf is written by
//! hand: the message set is small and fixed (field numbers from pprof's profile.proto).

use std::{collections::HashMap, io::Write};

use super::state::{HeapEntry, ProcessSnapshot};

/// One frame of a stack text line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub address: u64,
    pub function: String,
    pub file: String,
    pub line: i64,
}

/// Parses one line of a stack text; None for `[truncated]`.
pub fn parse_frame(line: &str) -> Option<Frame> {
    let (addr, rest) = line.split_once(' ')?;
    let address = u64::from_str_radix(addr.strip_prefix("0x")?, 16).ok()?;
    let rest = rest.strip_prefix("[inlined] ").unwrap_or(rest);
    // A Python frame of the mixed view (`ADDR [python] FUNC at FILE:LINE`): a function too.
    let rest = rest.strip_prefix("[python] ").unwrap_or(rest);
    let (function, file, line) = match rest.rsplit_once(" at ") {
        Some((f, loc)) => match loc.rsplit_once(':') {
            Some((file, n)) if n.parse::<i64>().is_ok() => {
                (f.to_string(), file.to_string(), n.parse().unwrap_or(0))
            }
            _ => (rest.to_string(), String::new(), 0),
        },
        None => (rest.to_string(), String::new(), 0),
    };
    Some(Frame {
        address,
        function,
        file,
        line,
    })
}

#[derive(Default)]
struct Builder {
    strings: Vec<String>,
    string_ids: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    function_msgs: Vec<Vec<u8>>,
    locations: HashMap<Frame, u64>,
    location_msgs: Vec<Vec<u8>>,
    samples: Vec<Vec<u8>>,
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, ((field as u64) << 3) | wire as u64);
}

fn int_field(out: &mut Vec<u8>, field: u32, v: u64) {
    if v != 0 {
        key(out, field, 0);
        varint(out, v);
    }
}

fn bytes_field(out: &mut Vec<u8>, field: u32, bytes: &[u8]) {
    key(out, field, 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn packed(out: &mut Vec<u8>, field: u32, values: impl Iterator<Item = u64>) {
    let mut body = Vec::new();
    for v in values {
        varint(&mut body, v);
    }
    bytes_field(out, field, &body);
}

impl Builder {
    fn new() -> Self {
        let mut b = Builder::default();
        b.string("");
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(id) = self.string_ids.get(s) {
            return *id;
        }
        let id = self.strings.len() as i64;
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), id);
        id
    }

    fn function(&mut self, name: &str, file: &str) -> u64 {
        let k = (self.string(name), self.string(file));
        if let Some(id) = self.functions.get(&k) {
            return *id;
        }
        let id = self.function_msgs.len() as u64 + 1;
        let mut m = Vec::new();
        int_field(&mut m, 1, id);
        int_field(&mut m, 2, k.0 as u64);
        int_field(&mut m, 3, k.0 as u64);
        int_field(&mut m, 4, k.1 as u64);
        self.function_msgs.push(m);
        self.functions.insert(k, id);
        id
    }

    /// A location names its function, file and line, never its absolute address: the
    /// profile goes to any local user who can reach the agent, and the code addresses of
    /// another user's (or root's) process would undo its address-space randomization.
    fn location(&mut self, f: &Frame) -> u64 {
        let f = &Frame {
            address: 0,
            ..f.clone()
        };
        if let Some(id) = self.locations.get(f) {
            return *id;
        }
        let function = self.function(&f.function, &f.file);
        let id = self.location_msgs.len() as u64 + 1;
        let mut line = Vec::new();
        int_field(&mut line, 1, function);
        int_field(&mut line, 2, f.line as u64);
        let mut m = Vec::new();
        int_field(&mut m, 1, id);
        bytes_field(&mut m, 4, &line);
        self.location_msgs.push(m);
        self.locations.insert(f.clone(), id);
        id
    }

    /// A sample, labelled `site` with the line of the program's own code that asked for the
    /// memory (`go tool pprof -tagfocus site=train.py:42`, `-tags`), and with `labels` (the
    /// process's container and pod: `-tagfocus pod_uid=...`).
    fn sample(&mut self, frames: &[Frame], e: &HeapEntry, site: &str, labels: &[(&str, &str)]) {
        let locs: Vec<u64> = frames.iter().map(|f| self.location(f)).collect();
        let mut m = Vec::new();
        packed(&mut m, 1, locs.into_iter());
        let values = [
            e.alloc_objects,
            e.alloc_bytes,
            e.inuse_objects,
            e.inuse_bytes,
        ];
        packed(&mut m, 2, values.iter().map(|v| v.round() as i64 as u64));
        for (k, v) in std::iter::once(("site", site)).chain(labels.iter().copied()) {
            let mut label = Vec::new();
            int_field(&mut label, 1, self.string(k) as u64);
            int_field(&mut label, 2, self.string(v) as u64);
            bytes_field(&mut m, 3, &label);
        }
        self.samples.push(m);
    }

    fn value_type(&mut self, ty: &str, unit: &str) -> Vec<u8> {
        let mut m = Vec::new();
        int_field(&mut m, 1, self.string(ty) as u64);
        int_field(&mut m, 2, self.string(unit) as u64);
        m
    }

    fn finish(mut self, time_nanos: u64, sample_bytes: u64) -> Vec<u8> {
        let types = [
            self.value_type("alloc_objects", "count"),
            self.value_type("alloc_space", "bytes"),
            self.value_type("inuse_objects", "count"),
            self.value_type("inuse_space", "bytes"),
        ];
        let period_type = self.value_type("space", "bytes");
        let default_type = self.string("inuse_space");
        let mut out = Vec::new();
        for t in &types {
            bytes_field(&mut out, 1, t);
        }
        for s in &self.samples {
            bytes_field(&mut out, 2, s);
        }
        for l in &self.location_msgs {
            bytes_field(&mut out, 4, l);
        }
        for f in &self.function_msgs {
            bytes_field(&mut out, 5, f);
        }
        for s in &self.strings {
            bytes_field(&mut out, 6, s.as_bytes());
        }
        int_field(&mut out, 9, time_nanos);
        bytes_field(&mut out, 11, &period_type);
        int_field(&mut out, 12, sample_bytes);
        int_field(&mut out, 14, default_type as u64);
        out
    }
}

/// The gzipped profile of the given processes.
pub fn heap_profile<'a>(
    processes: impl Iterator<Item = &'a ProcessSnapshot>,
    sample_bytes: u64,
) -> Vec<u8> {
    let mut b = Builder::new();
    for p in processes {
        let root = Frame {
            address: 0,
            function: format!("{} (pid {})", p.comm, p.pid),
            file: String::new(),
            line: 0,
        };
        let labels: Vec<(&str, &str)> = p.container.labels().collect();
        // Same order every time: the profile of an unchanged state is the same file.
        let mut entries: Vec<_> = p.heap.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        for (stack, e) in entries {
            let mut frames: Vec<Frame> = stack.lines().filter_map(parse_frame).collect();
            frames.push(root.clone());
            let site = crate::analysis::sites::user_site(stack, "");
            b.sample(&frames, e, &site, &labels);
        }
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let raw = b.finish(now, sample_bytes);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw).expect("in-memory write");
    gz.finish().expect("in-memory write")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_of_every_shape() {
        assert_eq!(
            parse_frame("0x00007f0000001234 thread_main at src/workload.c:245"),
            Some(Frame {
                address: 0x7f0000001234,
                function: "thread_main".into(),
                file: "src/workload.c".into(),
                line: 245
            })
        );
        let f = parse_frame("0x0000000000401000 [inlined] ns::f(int) at a b.c:0").unwrap();
        assert_eq!(
            (f.function.as_str(), f.file.as_str()),
            ("ns::f(int)", "a b.c")
        );
        let f = parse_frame("0x00007f00dead0000 [python] train_step at /job/train.py:42").unwrap();
        assert_eq!(
            (f.function.as_str(), f.file.as_str(), f.line),
            ("train_step", "/job/train.py", 42)
        );
        let f = parse_frame("0x0000000000401000 libfoo.so+0x1a2").unwrap();
        assert_eq!(f.function, "libfoo.so+0x1a2");
        assert_eq!(parse_frame("[truncated]"), None);
    }

    /// Issue 27: `/debug/pprof/heap` is open to every local user; the code addresses of a
    /// process they cannot read the maps of must not be in it.
    #[test]
    fn profiles_carry_no_absolute_code_addresses() {
        let address: u64 = 0x7f3a_5c21_1234;
        let mut p = ProcessSnapshot {
            pid: 7,
            comm: "job".into(),
            ..Default::default()
        };
        p.heap.insert(
            format!("0x{address:016x} thread_main at src/workload.c:245\n").into(),
            HeapEntry {
                inuse_objects: 1.0,
                inuse_bytes: 4096.0,
                alloc_objects: 1.0,
                alloc_bytes: 4096.0,
            },
        );
        let gz = heap_profile(std::iter::once(&p), 0);
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        let mut encoded = Vec::new();
        varint(&mut encoded, address);
        let text = String::from_utf8_lossy(&raw);
        assert!(text.contains("thread_main"), "the frame is still named");
        assert!(
            !raw.windows(encoded.len()).any(|w| w == encoded),
            "the profile holds the absolute address {address:#x}"
        );
    }

    #[test]
    fn varints_match_protobuf() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
    }
}

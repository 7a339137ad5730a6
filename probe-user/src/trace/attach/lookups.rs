//! The planner's ELF lookups remembered across runs and processes (`elf_lookups` in the cache
//! directory, see `trace::disk_cache`): for each object read, what the planner asked of it
//! (its probed functions and their `.cold` parts, DT_NEEDED, RUNPATH/RPATH, SONAME), keyed by
//! the file's identity. A stop in a directory seen before then costs a `stat` per object
//! instead of opening and parsing it.
//!
//! The identity is the device, inode, size and the modification and change times in
//! nanoseconds: a file rewritten in place changes its times, one replaced by a rename is
//! another inode, so a changed file is read again and never answered from the cache. The key
//! also holds a digest of the question (the probed names, and `FORMAT`): a tracer that probes
//! other functions does not take another's answers. One line per entry, `KEY<TAB>JSON`,
//! appended; the newest line of a key wins. A file we do not own, or that others can write,
//! is not used; lines that cannot be read are ignored with one warning; the file is started
//! afresh once it holds more than `MAX_ENTRIES` lines. Op libraries (their operator
//! functions) are not cached.

use super::files::FileId;
use crate::trace::disk_cache;
use memscope_symbols::ElfObject;
use memscope_symbols::elf::{FunctionSymbol, Lookup};
use serde_json::Value;
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

/// The cache file's name in the cache directory.
pub const FILE_NAME: &str = "elf_lookups";
/// Bump when what `ElfObject::open_lookup` answers for the same question changes.
const FORMAT: &str = "elf-lookup-1";
/// Lines kept before the file is started afresh.
const MAX_ENTRIES: usize = 20_000;
/// New entries are written in batches of this many (and when the planner is dropped).
const WRITE_EVERY: usize = 64;

pub(super) struct LookupCache {
    /// `None`: no cache (no home directory, or the file was not ours).
    path: Option<PathBuf>,
    /// Digest of the question, the first word of every key.
    digest: u64,
    /// Key -> JSON text, read at the first lookup.
    entries: Option<HashMap<String, String>>,
    /// Start the file afresh at the next write (it grew past `MAX_ENTRIES`).
    restart: bool,
    /// Lines not written yet.
    pending: String,
    pending_count: usize,
    /// Objects found in the cache, and objects read from their files (cached or not).
    pub(super) hits: usize,
    pub(super) misses: usize,
    /// For the user (the planner passes them on).
    pub(super) warnings: Vec<String>,
}

impl LookupCache {
    pub(super) fn new(lookup: &Lookup) -> Self {
        LookupCache {
            path: disk_cache::file(FILE_NAME),
            digest: digest(lookup),
            entries: None,
            restart: false,
            pending: String::new(),
            pending_count: 0,
            hits: 0,
            misses: 0,
            warnings: Vec::new(),
        }
    }

    fn key(&self, id: &FileId) -> String {
        format!(
            "{:016x} {} {} {} {} {}",
            self.digest, id.dev, id.ino, id.size, id.mtime_ns, id.ctime_ns
        )
    }

    /// What was remembered of the object with identity `id`, if anything.
    pub(super) fn get(&mut self, id: &FileId) -> Option<ElfObject> {
        let key = self.key(id);
        self.load();
        let text = self.entries.as_ref()?.get(&key)?;
        let found = from_json(text);
        match found {
            Some(_) => self.hits += 1,
            None => self.warnings.push(format!(
                "ignoring an unreadable entry of the ELF lookup cache {}",
                self.shown()
            )),
        }
        found
    }

    /// Remembers what was read of the object with identity `id`.
    pub(super) fn put(&mut self, id: &FileId, obj: &ElfObject) {
        if self.path.is_none() {
            return;
        }
        let key = self.key(id);
        let text = to_json(obj);
        self.pending.push_str(&key);
        self.pending.push('\t');
        self.pending.push_str(&text);
        self.pending.push('\n');
        self.pending_count += 1;
        if let Some(entries) = &mut self.entries {
            entries.insert(key, text);
        }
        if self.pending_count >= WRITE_EVERY {
            self.flush();
        }
    }

    fn shown(&self) -> String {
        self.path
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    /// Reads the file once; a file we cannot use is said once and left alone.
    fn load(&mut self) {
        if self.entries.is_some() {
            return;
        }
        let mut entries = HashMap::new();
        if let Some(path) = self.path.clone() {
            match std::fs::read(&path) {
                Ok(_) if !disk_cache::trusted(&path) => {
                    self.warnings.push(format!(
                        "not using the ELF lookup cache {}: it or its directory is not ours \
                         alone (owner, mode or symlink)",
                        path.display()
                    ));
                    self.path = None;
                }
                Ok(bytes) => {
                    let mut lines = 0;
                    let mut bad = 0;
                    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        lines += 1;
                        let parsed = std::str::from_utf8(line).ok().and_then(|l| {
                            let (key, text) = l.split_once('\t')?;
                            (key.split(' ').count() == 6).then_some((key, text))
                        });
                        match parsed {
                            Some((key, text)) => {
                                entries.insert(key.to_string(), text.to_string());
                            }
                            None => bad += 1,
                        }
                    }
                    if bad > 0 {
                        self.warnings.push(format!(
                            "ignoring {bad} unreadable line(s) of the ELF lookup cache {}",
                            path.display()
                        ));
                    }
                    self.restart = lines > MAX_ENTRIES;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    self.warnings.push(format!(
                        "not using the ELF lookup cache {}: {e}",
                        path.display()
                    ));
                    self.path = None;
                }
            }
        }
        self.entries = Some(entries);
    }

    /// Writes the pending entries (one `write`, appended: concurrent tracers do not mix lines).
    pub(super) fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let text = std::mem::take(&mut self.pending);
        self.pending_count = 0;
        let Some(path) = &self.path else { return };
        if std::mem::take(&mut self.restart) {
            let _ = std::fs::remove_file(path);
        }
        let written = disk_cache::open_append(path).map(|mut f| f.write_all(text.as_bytes()));
        if !matches!(written, Some(Ok(()))) {
            self.warnings.push(format!(
                "cannot write the ELF lookup cache {}{}",
                path.display(),
                match written {
                    Some(Err(e)) => format!(": {e}"),
                    _ => " (its directory is not ours alone)".into(),
                }
            ));
            self.path = None;
        }
    }
}

impl Drop for LookupCache {
    fn drop(&mut self) {
        self.flush();
    }
}

/// FNV-1a of `FORMAT`, the names asked for, and which of them want their `.cold` part.
fn digest(lookup: &Lookup) -> u64 {
    let mut names: Vec<&str> = lookup.names.to_vec();
    names.sort_unstable();
    let mut h = probe_common::FNV_OFFSET;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h = (h ^ *b as u64).wrapping_mul(probe_common::FNV_PRIME);
        }
    };
    eat(FORMAT.as_bytes());
    for n in names {
        eat(b"\0");
        eat(n.as_bytes());
        eat(if (lookup.cold_of)(n) { b"+" } else { b"-" });
    }
    h
}

/// The entry's JSON text, written directly (building a `serde_json::Value` first, a map of
/// owned keys and values, cost several times as much for each object of a directory).
fn to_json(obj: &ElfObject) -> String {
    use std::fmt::Write as _;
    /// A JSON string: quoted, with `"`, `\` and control characters escaped.
    fn text(out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
    fn list(out: &mut String, items: &[String]) {
        out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            text(out, item);
        }
        out.push(']');
    }
    fn optional(out: &mut String, v: &Option<String>) {
        match v {
            Some(v) => text(out, v),
            None => out.push_str("null"),
        }
    }
    let mut functions: Vec<&FunctionSymbol> = obj.functions.values().collect();
    functions.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::with_capacity(160);
    out.push_str("{\"exported\":");
    list(&mut out, &obj.exported);
    out.push_str(",\"functions\":[");
    for (i, f) in functions.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push('[');
        text(&mut out, &f.name);
        let _ = write!(out, ",{},{},{}]", f.address, f.size, f.file_offset);
    }
    out.push_str("],\"interpreter\":");
    optional(&mut out, &obj.interpreter);
    out.push_str(",\"needed\":");
    list(&mut out, &obj.needed);
    out.push_str(",\"rpath\":");
    list(&mut out, &obj.rpath);
    out.push_str(",\"runpath\":");
    list(&mut out, &obj.runpath);
    out.push_str(",\"soname\":");
    optional(&mut out, &obj.soname);
    out.push('}');
    out
}

fn from_json(text: &str) -> Option<ElfObject> {
    let v: Value = serde_json::from_str(text).ok()?;
    let strings = |name: &str| -> Option<Vec<String>> {
        v.get(name)?
            .as_array()?
            .iter()
            .map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let optional = |name: &str| -> Option<Option<String>> {
        match v.get(name)? {
            Value::Null => Some(None),
            s => Some(Some(s.as_str()?.to_string())),
        }
    };
    let mut functions = HashMap::new();
    for f in v.get("functions")?.as_array()? {
        let f = f.as_array()?;
        let [name, address, size, file_offset] = f.as_slice() else {
            return None;
        };
        let name = name.as_str()?.to_string();
        functions.insert(
            name.clone(),
            FunctionSymbol {
                name,
                address: address.as_u64()?,
                size: size.as_u64()?,
                file_offset: file_offset.as_u64()?,
            },
        );
    }
    let mut exported = strings("exported")?;
    exported.sort();
    Some(ElfObject {
        functions,
        exported,
        needed: strings("needed")?,
        soname: optional("soname")?,
        runpath: strings("runpath")?,
        rpath: strings("rpath")?,
        build_id: None,
        interpreter: optional("interpreter")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_entry_reads_back_as_it_was_written() {
        let mut obj = ElfObject {
            soname: Some("libx.so.1".into()),
            ..Default::default()
        };
        obj.needed.push("libx.so".into());
        obj.runpath.push("$ORIGIN/../lib".into());
        obj.rpath.push("/odd \"dir\"\\\n\u{1}é".into());
        obj.functions.insert(
            "halMemAlloc".into(),
            FunctionSymbol {
                name: "halMemAlloc".into(),
                address: 0x1234,
                size: 42,
                file_offset: 0x234,
            },
        );
        obj.exported.push("halMemAlloc".into());
        obj.exported.sort();
        let written = to_json(&obj);
        // The text is what serde_json makes of the same object (so any JSON reader takes it).
        let expected = json!({
            "functions": [["halMemAlloc", 0x1234, 42, 0x234]],
            "exported": obj.exported,
            "needed": obj.needed,
            "soname": obj.soname,
            "runpath": obj.runpath,
            "rpath": obj.rpath,
            "interpreter": obj.interpreter,
        });
        assert_eq!(serde_json::from_str::<Value>(&written).unwrap(), expected);
        let back = from_json(&written).unwrap();
        assert_eq!(back.functions, obj.functions);
        assert_eq!(back.exported, obj.exported);
        assert_eq!(back.needed, obj.needed);
        assert_eq!(back.runpath, obj.runpath);
        assert_eq!(back.rpath, obj.rpath);
        assert_eq!(back.soname, obj.soname);
        assert_eq!(back.interpreter, obj.interpreter);
        assert!(from_json("{\"functions\": 3}").is_none());
        assert!(from_json("not json").is_none());
    }

    #[test]
    fn another_question_is_another_key() {
        let a = Lookup {
            names: &["b", "a"],
            scan: None,
            cold_of: &|_| false,
        };
        let same = Lookup {
            names: &["a", "b"],
            scan: None,
            cold_of: &|_| false,
        };
        let more = Lookup {
            names: &["a", "b", "c"],
            scan: None,
            cold_of: &|_| false,
        };
        let cold = Lookup {
            names: &["a", "b"],
            scan: None,
            cold_of: &|n| n == "a",
        };
        assert_eq!(digest(&a), digest(&same));
        assert_ne!(digest(&a), digest(&more));
        assert_ne!(digest(&a), digest(&cold));
    }
}

//! A small pickle writer (protocol 2) for the values a memory snapshot holds: dicts with
//! string keys, lists, tuples, integers of any size up to 128 bits, strings, booleans and
//! `None`. Python's `pickle.load` (and torch's `_memory_viz.py`) read it as they read the
//! snapshot torch writes; a value shared through an [`Arc`] (the frames of a block and of
//! its trace entry) is written once and referenced after (the pickle memo).

use std::collections::HashMap;
use std::sync::Arc;

/// One Python value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i128),
    Str(String),
    List(Vec<Value>),
    Tuple(Vec<Value>),
    /// Keys in the order given (Python keeps insertion order).
    Dict(Vec<(&'static str, Value)>),
    /// Written once; later uses refer to the first through the memo.
    Shared(Arc<Value>),
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Value::Int(n.into())
    }
}

impl From<u32> for Value {
    fn from(n: u32) -> Self {
        Value::Int(n.into())
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(n.into())
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

const PROTO: u8 = 0x80;
const STOP: u8 = b'.';
const NONE: u8 = b'N';
const NEWTRUE: u8 = 0x88;
const NEWFALSE: u8 = 0x89;
const BININT: u8 = b'J';
const LONG1: u8 = 0x8a;
const BINUNICODE: u8 = b'X';
const EMPTY_LIST: u8 = b']';
const EMPTY_DICT: u8 = b'}';
const MARK: u8 = b'(';
const APPENDS: u8 = b'e';
const SETITEMS: u8 = b'u';
const TUPLE: u8 = b't';
const LONG_BINPUT: u8 = b'r';
const LONG_BINGET: u8 = b'j';
/// Items per APPENDS or SETITEMS.
const BATCH: usize = 1000;

/// `value` as a protocol 2 pickle.
pub fn dumps(value: &Value) -> Vec<u8> {
    let mut w = Writer {
        out: vec![PROTO, 2],
        memo: HashMap::new(),
    };
    w.value(value);
    w.out.push(STOP);
    w.out
}

struct Writer {
    out: Vec<u8>,
    /// A shared value's address -> its memo slot.
    memo: HashMap<*const Value, u32>,
}

impl Writer {
    fn value(&mut self, v: &Value) {
        match v {
            Value::None => self.out.push(NONE),
            Value::Bool(b) => self.out.push(if *b { NEWTRUE } else { NEWFALSE }),
            Value::Int(n) => self.int(*n),
            Value::Str(s) => self.str(s),
            Value::List(items) => {
                self.out.push(EMPTY_LIST);
                // In batches of 1000, as Python's pickle writes them: memory_viz's own
                // unpickler passes a batch's items as the arguments of one call.
                for batch in items.chunks(BATCH) {
                    self.out.push(MARK);
                    for item in batch {
                        self.value(item);
                    }
                    self.out.push(APPENDS);
                }
            }
            Value::Tuple(items) => {
                self.out.push(MARK);
                for item in items {
                    self.value(item);
                }
                self.out.push(TUPLE);
            }
            Value::Dict(pairs) => {
                self.out.push(EMPTY_DICT);
                for batch in pairs.chunks(BATCH) {
                    self.out.push(MARK);
                    for (k, item) in batch {
                        self.str(k);
                        self.value(item);
                    }
                    self.out.push(SETITEMS);
                }
            }
            Value::Shared(shared) => {
                let key = Arc::as_ptr(shared);
                if let Some(slot) = self.memo.get(&key) {
                    self.out.push(LONG_BINGET);
                    self.out.extend_from_slice(&slot.to_le_bytes());
                } else {
                    self.value(shared);
                    let slot = self.memo.len() as u32;
                    self.out.push(LONG_BINPUT);
                    self.out.extend_from_slice(&slot.to_le_bytes());
                    self.memo.insert(key, slot);
                }
            }
        }
    }

    fn int(&mut self, n: i128) {
        if let Ok(small) = i32::try_from(n) {
            self.out.push(BININT);
            self.out.extend_from_slice(&small.to_le_bytes());
            return;
        }
        // LONG1: little-endian two's complement, as few bytes as keep the sign.
        let bytes = n.to_le_bytes();
        let mut len = bytes.len();
        while len > 1 {
            let top = bytes[len - 1];
            let next_sign = bytes[len - 2] & 0x80;
            if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                len -= 1;
            } else {
                break;
            }
        }
        self.out.push(LONG1);
        self.out.push(len as u8);
        self.out.extend_from_slice(&bytes[..len]);
    }

    fn str(&mut self, s: &str) {
        self.out.push(BINUNICODE);
        self.out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.out.extend_from_slice(s.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Python's own pickle reads every value back as the `repr` it would print.
    #[test]
    fn python_reads_what_is_written() {
        let shared = Arc::new(Value::List(vec![Value::Dict(vec![
            ("filename", "a.py".into()),
            ("line", 3u32.into()),
        ])]));
        let v = Value::Dict(vec![
            ("none", Value::None),
            ("t", true.into()),
            ("f", false.into()),
            ("small", Value::Int(-5)),
            ("i32max", Value::Int(i32::MAX.into())),
            ("i32min", Value::Int(i32::MIN.into())),
            ("big", Value::Int(0x12c0_0000_0000)),
            ("u64max", u64::MAX.into()),
            ("neg", Value::Int(-(1i128 << 40))),
            ("s", "std::vector<int> é".into()),
            ("empty", Value::List(vec![])),
            ("long", Value::List((0..2500u32).map(Value::from).collect())),
            ("tuple", Value::Tuple(vec![Value::Int(0), Value::Int(0)])),
            ("a", Value::Shared(shared.clone())),
            ("b", Value::Shared(shared)),
            ("nested", Value::Dict(vec![])),
        ]);
        let dir = std::env::temp_dir().join(format!("pickle-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("v.pickle");
        std::fs::write(&file, dumps(&v)).unwrap();
        let out = Command::new("python3")
            .arg("-c")
            .arg(
                "import pickle,sys; v=pickle.load(open(sys.argv[1],'rb')); \
                 assert v['a'] is v['b']; assert v.pop('long') == list(range(2500)); \
                 print(repr(v))",
            )
            .arg(&file)
            .output()
            .expect("python3");
        std::fs::remove_dir_all(&dir).ok();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "{'none': None, 't': True, 'f': False, 'small': -5, 'i32max': 2147483647, \
             'i32min': -2147483648, 'big': 20615843020800, 'u64max': 18446744073709551615, \
             'neg': -1099511627776, 's': 'std::vector<int> é', 'empty': [], 'tuple': (0, 0), \
             'a': [{'filename': 'a.py', 'line': 3}], 'b': [{'filename': 'a.py', 'line': 3}], \
             'nested': {}}"
        );
    }
}

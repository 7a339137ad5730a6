//! The "Attr" column in its two spellings: the CSV text `{k:v,k:v}` (msMemScope writes it
//! without any escaping) and the JSON object `{"k":"v",...}` stored in the SQLite dump, where
//! every value is a string.

/// Splits the inside of the braces (`allocation_id:1,addr:0x10,size:4`) into key/value pairs,
/// in order.
///
/// msMemScope does not escape values, so a value may itself contain commas
/// (`shape:torch.Size([1,5])`, `inefficient_type:early_allocation,late_deallocation`) or colons.
/// A comma therefore only starts a new pair when the text after it, up to the next colon, looks
/// like a key (letters, digits, `_`, `.`, `-` or spaces, starting with a letter or `_`).
/// Text without any key before its first colon is kept whole under the empty key.
pub fn split_attr(inner: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if inner.is_empty() {
        return out;
    }
    // Byte offsets where a pair starts: 0 and after every comma that is followed by `key:`.
    let mut starts = vec![0usize];
    for (i, c) in inner.char_indices() {
        if c == ',' && looks_like_key_start(&inner[i + 1..]) {
            starts.push(i + 1);
        }
    }
    for (n, &s) in starts.iter().enumerate() {
        let end = match starts.get(n + 1) {
            Some(&next) => next - 1, // the separating comma
            None => inner.len(),
        };
        let piece = &inner[s..end];
        match piece.split_once(':') {
            Some((k, v)) if is_key(k) => out.push((k.to_string(), v.to_string())),
            _ => out.push((String::new(), piece.to_string())),
        }
    }
    out
}

fn is_key(k: &str) -> bool {
    let mut chars = k.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | ' '))
}

fn looks_like_key_start(rest: &str) -> bool {
    match rest.split_once(':') {
        Some((k, _)) => !k.contains(',') && is_key(k),
        None => false,
    }
}

/// The inside of the braces again: `k:v,k:v` (a pair with an empty key is written bare).
pub fn join_attr(pairs: &[(String, String)]) -> String {
    let mut s = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        if !k.is_empty() {
            s.push_str(k);
            s.push(':');
        }
        s.push_str(v);
    }
    s
}

/// `{"k":"v",...}` with every value a string; no pairs gives `{}`.
pub fn to_json(pairs: &[(String, String)]) -> String {
    let mut s = String::with_capacity(16 + pairs.len() * 24);
    s.push('{');
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        json_string(k, &mut s);
        s.push(':');
        json_string(v, &mut s);
    }
    s.push('}');
    s
}

/// The CSV Attr text (inside of the braces) as the JSON stored in the db.
pub fn attr_text_to_json(inner: &str) -> String {
    to_json(&split_attr(inner))
}

fn json_string(v: &str, out: &mut String) {
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parses a flat JSON object (`{"k":"v",...}`). String values are taken as they are; numbers,
/// `true`, `false` and `null` are kept as their text. Nested objects and arrays are refused.
pub fn parse_json_object(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut p = JsonParser {
        s: text.as_bytes(),
        text,
        i: 0,
    };
    p.ws();
    p.expect(b'{')?;
    let mut out = Vec::new();
    p.ws();
    if p.peek() == Some(b'}') {
        p.i += 1;
    } else {
        loop {
            p.ws();
            let k = p.string()?;
            p.ws();
            p.expect(b':')?;
            p.ws();
            let v = match p.peek() {
                Some(b'"') => p.string()?,
                Some(b'{') | Some(b'[') => {
                    return Err(format!(
                        "nested value for key \"{k}\" at byte {} (a flat object was expected)",
                        p.i
                    ));
                }
                Some(_) => p.bare()?,
                None => return Err("unexpected end of JSON".into()),
            };
            out.push((k, v));
            p.ws();
            match p.peek() {
                Some(b',') => p.i += 1,
                Some(b'}') => {
                    p.i += 1;
                    break;
                }
                _ => return Err(format!("expected ',' or '}}' at byte {}", p.i)),
            }
        }
    }
    p.ws();
    if p.i != p.s.len() {
        return Err(format!("unexpected text after the object at byte {}", p.i));
    }
    Ok(out)
}

struct JsonParser<'a> {
    s: &'a [u8],
    text: &'a str,
    i: usize,
}

impl JsonParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.peek() == Some(c) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.i))
        }
    }

    fn bare(&mut self) -> Result<String, String> {
        let start = self.i;
        while let Some(c) = self.peek() {
            if matches!(c, b',' | b'}' | b' ' | b'\t' | b'\n' | b'\r') {
                break;
            }
            self.i += 1;
        }
        let v = &self.text[start..self.i];
        let ok = matches!(v, "true" | "false" | "null")
            || (!v.is_empty()
                && v.bytes()
                    .all(|b| b.is_ascii_digit() || matches!(b, b'-' | b'+' | b'.' | b'e' | b'E')));
        if ok {
            Ok(v.to_string())
        } else {
            Err(format!("invalid JSON value at byte {start}"))
        }
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let h = self
            .text
            .get(self.i..self.i + 4)
            .ok_or_else(|| "truncated \\u escape".to_string())?;
        let v =
            u32::from_str_radix(h, 16).map_err(|_| format!("bad \\u escape at byte {}", self.i))?;
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let start = self.i;
            while let Some(c) = self.peek() {
                if c == b'"' || c == b'\\' || c < 0x20 {
                    break;
                }
                self.i += 1;
            }
            out.push_str(&self.text[start..self.i]);
            match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let e = self.peek().ok_or("unterminated string")?;
                    self.i += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let mut cp = self.hex4()?;
                            if (0xD800..0xDC00).contains(&cp)
                                && self.s.get(self.i) == Some(&b'\\')
                                && self.s.get(self.i + 1) == Some(&b'u')
                            {
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err("invalid surrogate pair".into());
                                }
                                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                            }
                            out.push(char::from_u32(cp).ok_or("invalid \\u code point")?);
                        }
                        _ => return Err(format!("invalid escape at byte {}", self.i - 1)),
                    }
                }
                Some(_) => return Err(format!("control character in string at byte {}", self.i)),
                None => return Err("unterminated string".into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn splits_plain_and_awkward_values() {
        assert_eq!(
            split_attr("allocation_id:1,addr:0x0000000000003039,size:10,used:10"),
            pairs(&[
                ("allocation_id", "1"),
                ("addr", "0x0000000000003039"),
                ("size", "10"),
                ("used", "10")
            ])
        );
        assert_eq!(
            split_attr("allocation_id:1,type:PTA,dtype:torch.float16,shape:torch.Size([1,5])"),
            pairs(&[
                ("allocation_id", "1"),
                ("type", "PTA"),
                ("dtype", "torch.float16"),
                ("shape", "torch.Size([1,5])")
            ])
        );
        assert_eq!(
            split_attr("size:4,inefficient_type:early_allocation,late_deallocation"),
            pairs(&[
                ("size", "4"),
                ("inefficient_type", "early_allocation,late_deallocation")
            ])
        );
        // The 2025-04 layout: empty owner, MID, negative free sizes.
        assert_eq!(
            split_attr("addr:20615843020800,size:-16384,owner:,MID:7"),
            pairs(&[
                ("addr", "20615843020800"),
                ("size", "-16384"),
                ("owner", ""),
                ("MID", "7")
            ])
        );
        assert_eq!(
            split_attr("path:0_1/0/0_GraphOperation,workspace ptr:0x1,time:12:30"),
            pairs(&[
                ("path", "0_1/0/0_GraphOperation"),
                ("workspace ptr", "0x1"),
                ("time", "12:30")
            ])
        );
        assert_eq!(split_attr(""), vec![]);
        assert_eq!(split_attr("no key here"), pairs(&[("", "no key here")]));
    }

    #[test]
    fn join_round_trips() {
        for s in [
            "allocation_id:1,addr:0x10,size:4",
            "shape:torch.Size([1,5]),owner:",
            "free:10,total:20",
        ] {
            assert_eq!(join_attr(&split_attr(s)), s);
        }
    }

    #[test]
    fn json_written_and_read_back() {
        assert_eq!(to_json(&[]), "{}");
        assert_eq!(
            attr_text_to_json("allocation_id:1,size:10"),
            r#"{"allocation_id":"1","size":"10"}"#
        );
        let tricky = pairs(&[("k", "a\"b\\c\nd\u{1}"), ("shape", "[1,5]"), ("e", "")]);
        let j = to_json(&tricky);
        assert_eq!(j, r#"{"k":"a\"b\\c\nd\u0001","shape":"[1,5]","e":""}"#);
        assert_eq!(parse_json_object(&j).unwrap(), tricky);
        assert_eq!(
            parse_json_object(r#" { "a" : 1 , "b":true, "c":"\u00e9\ud83d\ude00" } "#).unwrap(),
            pairs(&[("a", "1"), ("b", "true"), ("c", "é😀")])
        );
        assert_eq!(parse_json_object("{}").unwrap(), vec![]);
        for bad in [
            "",
            "{",
            "{\"a\"}",
            "{\"a\":}",
            "{\"a\":\"b\"",
            "{\"a\":[1]}",
            "{\"a\":\"b\"} x",
            "{\"a\":x}",
            "{\"a\":\"\\q\"}",
            "[]",
        ] {
            assert!(parse_json_object(bad).is_err(), "{bad:?} must be refused");
        }
    }
}

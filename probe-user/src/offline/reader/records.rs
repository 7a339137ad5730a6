//! CSV records of a dump, fed one physical line at a time: fields may be quoted, with `""`
//! for a quote, and a quoted field may span lines (msMemScope's C call stacks do). A field
//! msMemScope quoted again for each device file it copied it to (`""step start""`), which
//! standard CSV cannot read, is taken as its text without the quotes.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    /// At the start of a field.
    Start,
    Unquoted,
    Quoted,
    /// Just after a quote inside a quoted field: `"` doubles it, `,` ends the field.
    AfterQuote,
}

/// Splits CSV records fed one physical line at a time.
pub(super) struct Records {
    fields: Vec<Vec<u8>>,
    cur: Vec<u8>,
    st: St,
    /// A record is in progress (a quoted field continues on the next line).
    pub(super) open: bool,
}

impl Records {
    pub(super) fn new() -> Self {
        Records {
            fields: Vec::with_capacity(12),
            cur: Vec::new(),
            st: St::Start,
            open: false,
        }
    }

    /// Feeds one line without its line ending. `Ok(true)` when the record is complete.
    pub(super) fn feed(&mut self, line: &[u8]) -> Result<bool, String> {
        if self.open {
            // Continuing a quoted field across a line break.
            self.cur.push(b'\n');
        }
        self.open = true;
        let mut i = 0;
        while i < line.len() {
            let b = line[i];
            i += 1;
            match self.st {
                St::Start if b == b'"' => {
                    if let Some(end) = requoted_field_end(line, i - 1) {
                        // `""name""`: msMemScope's quotes around quotes, all of it wrapping.
                        let raw = &line[i - 1..end];
                        let start = raw.iter().position(|&c| c != b'"').unwrap_or(raw.len());
                        let stop = raw
                            .iter()
                            .rposition(|&c| c != b'"')
                            .map_or(start, |p| p + 1);
                        self.cur.extend_from_slice(&raw[start..stop]);
                        i = end;
                        self.st = St::Unquoted;
                    } else {
                        self.st = St::Quoted;
                    }
                }
                St::Start => match b {
                    b',' => self.fields.push(Vec::new()),
                    _ => {
                        self.cur.push(b);
                        self.st = St::Unquoted;
                    }
                },
                St::Unquoted => {
                    if b == b',' {
                        self.end_field();
                    } else {
                        self.cur.push(b);
                    }
                }
                St::Quoted => {
                    if b == b'"' {
                        self.st = St::AfterQuote;
                    } else {
                        self.cur.push(b);
                    }
                }
                St::AfterQuote => match b {
                    b'"' => {
                        self.cur.push(b'"');
                        self.st = St::Quoted;
                    }
                    b',' => self.end_field(),
                    _ => {
                        return Err(format!(
                            "field {} has text after its closing quote (a quote inside a \
                             quoted field must be doubled)",
                            self.fields.len() + 1
                        ));
                    }
                },
            }
        }
        if self.st == St::Quoted {
            return Ok(false);
        }
        self.end_field();
        self.open = false;
        Ok(true)
    }

    /// Bytes held for the record in progress.
    pub(super) fn pending_bytes(&self) -> usize {
        self.cur.len() + self.fields.iter().map(Vec::len).sum::<usize>()
    }

    fn end_field(&mut self) {
        self.fields.push(std::mem::take(&mut self.cur));
        self.st = St::Start;
    }

    pub(super) fn take(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.fields)
    }
}

/// Where a field that opens with an even run of quotes followed by text ends (the next comma
/// or the line's end): msMemScope's twice-quoted name (`""step start""`), which standard CSV
/// cannot read (a closed quote followed by text). None for anything standard CSV reads.
fn requoted_field_end(line: &[u8], start: usize) -> Option<usize> {
    let run = line[start..].iter().take_while(|&&c| c == b'"').count();
    let after = *line.get(start + run)?;
    if run < 2 || run % 2 != 0 || after == b',' {
        return None;
    }
    Some(
        line[start + run..]
            .iter()
            .position(|&c| c == b',')
            .map_or(line.len(), |p| start + run + p),
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::offline::reader) fn records(lines: &[&str]) -> Result<Vec<Vec<String>>, String> {
        let mut r = Records::new();
        let mut out = Vec::new();
        for l in lines {
            if r.feed(l.as_bytes())? {
                out.push(
                    r.take()
                        .into_iter()
                        .map(|f| String::from_utf8(f).unwrap())
                        .collect(),
                );
            }
        }
        if r.open {
            return Err("open".into());
        }
        Ok(out)
    }

    #[test]
    fn csv_records_with_quotes_commas_and_newlines() {
        assert_eq!(records(&["a,b,,c"]).unwrap(), vec![vec!["a", "b", "", "c"]]);
        assert_eq!(records(&["a,"]).unwrap(), vec![vec!["a", ""]]);
        assert_eq!(
            records(&["1,\"x,y\",\"say \"\"hi\"\"\",\"\""]).unwrap(),
            vec![vec!["1", "x,y", "say \"hi\"", ""]]
        );
        assert_eq!(
            records(&["1,\"frame one", "frame two,", "\",end", "2,x"]).unwrap(),
            vec![vec!["1", "frame one\nframe two,\n", "end"], vec!["2", "x"]]
        );
        // A quote inside an unquoted field is kept as it is.
        assert_eq!(records(&["a\"b,c"]).unwrap(), vec![vec!["a\"b", "c"]]);
        assert!(records(&["\"a\"b,c"]).unwrap_err().contains("field 1"));
        assert_eq!(records(&["\"never closed"]).unwrap_err(), "open");
    }
}

//! One escaping rule for the text of a run on its way into the report's outputs. Function,
//! file and owner names, labels and op names come from dumps and from the traced programs
//! (a source file may be named `<img src=x onerror=...>.c`), so none is ever trusted:
//!
//! * flame-graph frames ([`frame`]: `.folded` lines, the HTML flame charts, speedscope): `;`
//!   separates frames and a line break ends a stack there, so a name can never add frames or
//!   stacks of its own;
//! * JSON embedded in the HTML page ([`json_in_html`]): no character of the run can end the
//!   script element, open a comment or start a tag;
//! * HTML built by the page's script: `esc()` in `assets/report/report.js`, the same rule for
//!   every string the script puts into markup (ECharts tooltips); everything else is set as
//!   text (`textContent`), and the page's Content-Security-Policy runs no inline handler.

use serde_json::Value;

/// A name as one flame-graph frame: `;` becomes `:`, control characters (a line break, a tab)
/// are written as escapes (`\n`, `\t`, `\u{1b}`), everything else is kept.
pub fn frame(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            ';' => out.push(':'),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// `value` as JSON text for a `<script type="application/json">` element: `<`, `>` and `&`
/// are written as `\u003c`, `\u003e`, `\u0026` (JSON.parse reads them back unchanged), and the
/// line separators U+2028/U+2029 as escapes too.
pub fn json_in_html(value: &Value) -> String {
    let json = serde_json::to_string(value).expect("a JSON value serializes");
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_frame_cannot_add_frames_or_stacks() {
        assert_eq!(frame("a;b"), "a:b");
        assert_eq!(frame("owner\nfake;stack 99999"), "owner\\nfake:stack 99999");
        assert_eq!(frame("tab\there\r"), "tab\\there\\r");
        assert_eq!(frame("ns::f<int> (x.c:3)"), "ns::f<int> (x.c:3)");
    }

    #[test]
    fn embedded_json_has_no_markup_and_reads_back_unchanged() {
        let v = json!({"n": "</script><img src=x onerror=alert(1)>&amp;<!--\u{2028}"});
        let text = json_in_html(&v);
        for bad in ['<', '>', '&', '\u{2028}'] {
            assert!(!text.contains(bad), "{bad:?} in {text}");
        }
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
    }
}

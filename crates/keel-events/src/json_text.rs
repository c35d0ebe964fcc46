//! JSON text appended straight to a `String`, for the run report's events: a report holds
//! about a dozen events per step, and writing them through `serde_json`'s serializer (a
//! byte-at-a-time escape loop and a `Write` call per fragment) was a quarter of a step's
//! cost. The output is byte for byte what `serde_json::to_string` writes (tests below hold
//! it to that), so readers cannot tell which wrote a report.

use serde_json::{Map, Number, Value};

/// Append `text` as a JSON string, escaped as `serde_json` escapes it: `"` and `\`, the
/// short escapes `\b \t \n \f \r`, other control characters as `\u00XX`, nothing else.
#[inline]
pub(crate) fn write_str(out: &mut String, text: &str) {
    out.reserve(text.len() + 2);
    out.push('"');
    if needs_escape(text.as_bytes()) {
        write_escaped(out, text);
    } else {
        out.push_str(text);
    }
    out.push('"');
}

/// Whether any byte needs an escape. Written as a branch-free fold over the bytes so the
/// compiler can check many at once: almost no text in a report needs one.
fn needs_escape(bytes: &[u8]) -> bool {
    bytes.iter().fold(false, |any, &b| {
        any | (b < 0x20) | (b == b'"') | (b == b'\\')
    })
}

fn write_escaped(out: &mut String, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut run_start = 0;
    for (i, b) in text.bytes().enumerate() {
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            0x08 => "\\b",
            b'\t' => "\\t",
            b'\n' => "\\n",
            0x0c => "\\f",
            b'\r' => "\\r",
            0x00..=0x1f => "",
            _ => continue,
        };
        // Every byte escaped is ASCII, so `i` is a char boundary.
        out.push_str(&text[run_start..i]);
        run_start = i + 1;
        if short.is_empty() {
            out.push_str("\\u00");
            out.push(HEX[usize::from(b >> 4)] as char);
            out.push(HEX[usize::from(b & 0xf)] as char);
        } else {
            out.push_str(short);
        }
    }
    out.push_str(&text[run_start..]);
}

/// Append `value` as compact JSON.
pub(crate) fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(number) => write_number(out, number),
        Value::String(text) => write_str(out, text),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(fields) => write_object(out, fields),
    }
}

fn write_object(out: &mut String, fields: &Map<String, Value>) {
    out.push('{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(out, key);
        out.push(':');
        write_value(out, value);
    }
    out.push('}');
}

fn write_number(out: &mut String, number: &Number) {
    if let Some(n) = number.as_u64() {
        out.push_str(itoa::Buffer::new().format(n));
    } else if let Some(n) = number.as_i64() {
        out.push_str(itoa::Buffer::new().format(n));
    } else {
        // Floats are rare in a report; `Number`'s own `Display` is what serde_json writes.
        out.push_str(&number.to_string());
    }
}

/// Append an unsigned integer.
#[inline]
pub(crate) fn write_u64(out: &mut String, n: u64) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// Append `,"key":` (or `"key":` for the first field of an object): `key` is a literal
/// that needs no escape. Inlined, so that the key's length is a constant and copying it
/// needs no call to `memcpy`.
#[inline(always)]
pub(crate) fn write_key(out: &mut String, first: &mut bool, key: &str) {
    debug_assert!(!needs_escape(key.as_bytes()));
    if !std::mem::take(first) {
        out.push(',');
    }
    out.push('"');
    out.push_str(key);
    out.push_str("\":");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn written(value: &Value) -> String {
        let mut out = String::new();
        write_value(&mut out, value);
        out
    }

    #[test]
    fn every_byte_is_escaped_as_serde_json_escapes_it() {
        let all_ascii: String = (0u8..=0x7f).map(char::from).collect();
        for text in [
            all_ascii.as_str(),
            "",
            "plain",
            "tab\tand \"quotes\" and \\ and é, 日本, \u{7f}, \u{2028}",
            "\u{0}\u{1f}x\u{1b}[0m",
        ] {
            let mut out = String::new();
            write_str(&mut out, text);
            assert_eq!(out, serde_json::to_string(text).unwrap(), "{text:?}");
        }
    }

    #[test]
    fn values_are_written_as_serde_json_writes_them() {
        let value = json!({
            "null": null, "t": true, "f": false,
            "u": 18446744073709551615u64, "i": -9223372036854775808i64, "zero": 0,
            "floats": [0.5, -1.25e-7, 1e300, 3.0],
            "nested": {"a": [[], {}, [{"b\n": "c\u{1}"}]], "": ""},
            "text": "line\r\nnext",
        });
        assert_eq!(written(&value), serde_json::to_string(&value).unwrap());
    }

    #[test]
    fn keys_are_separated_by_commas() {
        let mut out = String::from("{");
        let mut first = true;
        write_key(&mut out, &mut first, "a");
        write_u64(&mut out, 1);
        write_key(&mut out, &mut first, "b");
        write_u64(&mut out, 2);
        out.push('}');
        assert_eq!(out, r#"{"a":1,"b":2}"#);
    }
}

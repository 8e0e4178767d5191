//! JSON as Python's `json` module writes it, which LeRobot's metadata is: the bare tokens `NaN`,
//! `Infinity` and `-Infinity` stand for non-finite numbers (a statistic over data holding NaN
//! or infinities is one). Strict JSON has no such numbers, and a [`Value`] cannot hold them, so
//! inside a [`Value`] they are the strings `"NaN"`, `"Infinity"` and `"-Infinity"`: [`parse`]
//! reads the tokens into those strings, [`number`] makes them, [`to_string_pretty`] writes them
//! back as tokens and [`as_f64`] reads them as numbers.

use serde_json::Value;

/// The non-finite numbers' spellings, with their values.
const TOKENS: [(&str, f64); 3] = [("NaN", f64::NAN), ("-Infinity", f64::NEG_INFINITY), ("Infinity", f64::INFINITY)];

/// `x` as a JSON value: a number, or the string standing for a non-finite one.
pub fn number(x: f64) -> Value {
    match serde_json::Number::from_f64(x) {
        Some(n) => Value::Number(n),
        None if x.is_nan() => Value::String("NaN".into()),
        None if x > 0.0 => Value::String("Infinity".into()),
        None => Value::String("-Infinity".into()),
    }
}

/// A number, or a string standing for a non-finite one, as `f64`.
pub fn as_f64(value: &Value) -> Option<f64> {
    match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => TOKENS.iter().find(|(t, _)| t == s).map(|(_, x)| *x),
        _ => None,
    }
}

/// Parses JSON that may hold Python's `NaN`, `Infinity` and `-Infinity` tokens (outside
/// strings), each read as the string of its name.
///
/// # Errors
/// When the text is not JSON even so.
pub fn parse(text: &[u8]) -> serde_json::Result<Value> {
    match serde_json::from_slice(text) {
        Ok(value) => Ok(value),
        Err(strict) => {
            let quoted = quote_tokens(text);
            if quoted.len() == text.len() {
                return Err(strict);
            }
            serde_json::from_slice(&quoted).map_err(|_| strict)
        }
    }
}

/// `text` with each non-finite token outside strings put in quotes.
fn quote_tokens(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 16);
    let (mut i, mut in_string) = (0, false);
    while i < text.len() {
        let b = text[i];
        if in_string {
            out.push(b);
            match b {
                b'\\' if i + 1 < text.len() => {
                    out.push(text[i + 1]);
                    i += 1;
                }
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if b == b'"' {
            in_string = true;
        } else if let Some((token, _)) = TOKENS.iter().find(|(t, _)| text[i..].starts_with(t.as_bytes())) {
            out.push(b'"');
            out.extend_from_slice(token.as_bytes());
            out.push(b'"');
            i += token.len();
            continue;
        }
        out.push(b);
        i += 1;
    }
    out
}

/// `value` as indented JSON (4 spaces, as LeRobot writes its metadata), with the strings
/// standing for non-finite numbers written as Python's tokens.
pub fn to_string_pretty(value: &Value) -> String {
    let mut out = String::new();
    write(value, 0, &mut out);
    out
}

fn write(value: &Value, depth: usize, out: &mut String) {
    let indent = |depth: usize, out: &mut String| {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', 4 * depth));
    };
    match value {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(depth + 1, out);
                write(item, depth + 1, out);
            }
            indent(depth, out);
            out.push(']');
        }
        Value::Object(entries) if !entries.is_empty() => {
            out.push('{');
            for (i, (key, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(depth + 1, out);
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(": ");
                write(item, depth + 1, out);
            }
            indent(depth, out);
            out.push('}');
        }
        Value::String(s) if TOKENS.iter().any(|(t, _)| t == s) => out.push_str(s),
        other => out.push_str(&other.to_string()),
    }
}

/// `value` with the strings standing for non-finite numbers replaced by `null` (strict JSON,
/// for clients that read nothing else).
pub fn strict(value: &Value) -> Value {
    match value {
        Value::Array(items) => Value::Array(items.iter().map(strict).collect()),
        Value::Object(entries) => Value::Object(entries.iter().map(|(k, v)| (k.clone(), strict(v))).collect()),
        Value::String(s) if TOKENS.iter().any(|(t, _)| t == s) => Value::Null,
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn python_tokens_round_trip_and_strings_keep_their_words() {
        let text = br#"{"a": {"min": [NaN, -Infinity, 1.5], "max": [Infinity]}, "NaN": "Infinity is a word, so is NaN", "e": "\"NaN"}"#;
        let value = parse(text).expect("parses");
        assert_eq!(value["a"]["min"], json!(["NaN", "-Infinity", 1.5]));
        assert_eq!(value["NaN"], json!("Infinity is a word, so is NaN"), "inside strings nothing changes");
        assert_eq!(value["e"], json!("\"NaN"));
        let mins: Vec<f64> = value["a"]["min"].as_array().expect("list").iter().map(|v| as_f64(v).expect("number")).collect();
        assert!(mins[0].is_nan() && mins[1] == f64::NEG_INFINITY && mins[2] == 1.5);
        let written = to_string_pretty(&json!({"x": [number(f64::NAN), number(f64::INFINITY), number(-2.0)], "empty": []}));
        assert_eq!(written, "{\n    \"x\": [\n        NaN,\n        Infinity,\n        -2.0\n    ],\n    \"empty\": []\n}");
        assert_eq!(parse(written.as_bytes()).expect("reads back")["x"][1], json!("Infinity"));
        assert_eq!(strict(&value["a"]), json!({"min": [null, null, 1.5], "max": [null]}));
        assert!(parse(b"{\"a\": nope}").is_err(), "what is not JSON stays an error");
    }
}

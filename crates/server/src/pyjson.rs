//! JSON text the way Python's `json.dumps(x, ensure_ascii=False)` writes it (", " and
//! ": " separators), which is how Hugging Face chat templates' `tojson` renders tool
//! definitions and calls, and so the form models were trained on.

use std::io;

use serde::Serialize;
use serde_json::ser::Formatter;

struct PythonStyle;

impl Formatter for PythonStyle {
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// `value` as Python-style JSON text.
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonStyle);
    // Serializing a `serde_json::Value` (or plain data) into memory cannot fail.
    let _ = value.serialize(&mut ser);
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_python_json_dumps() {
        // python3 -c 'import json; print(json.dumps({"a": [1, {"b": "é\n"}], "c": None}, ensure_ascii=False))'
        let v: serde_json::Value =
            serde_json::from_str(r#"{"a": [1, {"b": "é\n"}], "c": null}"#).unwrap();
        assert_eq!(
            super::to_string(&v),
            "{\"a\": [1, {\"b\": \"é\\n\"}], \"c\": null}"
        );
        assert_eq!(super::to_string(&serde_json::json!([])), "[]");
        assert_eq!(super::to_string(&serde_json::json!({})), "{}");
    }
}

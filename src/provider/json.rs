//! A small JSON writer for the renderers: request bodies are written field by field in a
//! fixed order (deterministic bytes), with strings escaped eight bytes at a time (most text
//! needs no escape, and its runs are copied whole). Escapes follow serde_json: `\"`, `\\`,
//! `\n`, `\r`, `\t`, `\b`, `\f`, other control characters as `\u00XX`; nothing else.

/// A JSON text being written.
pub(crate) struct JsonWriter {
    out: Vec<u8>,
    /// Per open object or array: whether a member was written (a comma comes next).
    started: Vec<bool>,
    /// A key was just written: the value that follows takes no comma.
    after_key: bool,
}

impl JsonWriter {
    pub(crate) fn with_capacity(n: usize) -> JsonWriter {
        JsonWriter {
            out: Vec::with_capacity(n),
            started: Vec::with_capacity(8),
            after_key: false,
        }
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        debug_assert!(self.started.is_empty(), "every object and array is closed");
        self.out
    }

    fn comma(&mut self) {
        if std::mem::take(&mut self.after_key) {
            return;
        }
        if let Some(s) = self.started.last_mut() {
            if *s {
                self.out.push(b',');
            }
            *s = true;
        }
    }

    /// Opens an object (as a value, or after [`JsonWriter::key`]).
    pub(crate) fn object(&mut self) -> &mut Self {
        self.comma();
        self.out.push(b'{');
        self.started.push(false);
        self
    }

    /// Opens an array.
    pub(crate) fn array(&mut self) -> &mut Self {
        self.comma();
        self.out.push(b'[');
        self.started.push(false);
        self
    }

    /// Closes the innermost object.
    pub(crate) fn end_object(&mut self) -> &mut Self {
        self.started.pop();
        self.out.push(b'}');
        self
    }

    /// Closes the innermost array.
    pub(crate) fn end_array(&mut self) -> &mut Self {
        self.started.pop();
        self.out.push(b']');
        self
    }

    /// Writes a key; its value must follow (the value writes no comma).
    pub(crate) fn key(&mut self, key: &str) -> &mut Self {
        self.comma();
        escape_into(&mut self.out, key);
        self.out.push(b':');
        self.after_key = true;
        self
    }

    /// A string value.
    pub(crate) fn str(&mut self, value: &str) -> &mut Self {
        self.comma();
        escape_into(&mut self.out, value);
        self
    }

    /// A number value.
    pub(crate) fn u64(&mut self, value: u64) -> &mut Self {
        self.comma();
        self.out.extend_from_slice(value.to_string().as_bytes());
        self
    }

    /// A boolean value.
    pub(crate) fn bool(&mut self, value: bool) -> &mut Self {
        self.comma();
        self.out
            .extend_from_slice(if value { b"true" } else { b"false" });
        self
    }

    /// `null`.
    pub(crate) fn null(&mut self) -> &mut Self {
        self.comma();
        self.out.extend_from_slice(b"null");
        self
    }

    /// Text that is already JSON (raw tool arguments), copied as it is.
    pub(crate) fn raw(&mut self, json: &str) -> &mut Self {
        self.comma();
        self.out.extend_from_slice(json.as_bytes());
        self
    }

    /// Any serializable value (schemas, floats), written by serde_json.
    pub(crate) fn serde<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> &mut Self {
        self.comma();
        serde_json::to_writer(&mut self.out, value).expect("a value serializes");
        self
    }

    /// `"key": "value"`.
    pub(crate) fn field_str(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key).str(value)
    }
}

/// The sampling settings every family takes under the same names: `temperature`, `top_p`,
/// and the stop sequences under `stop_key` (when the family has them).
pub(crate) fn sampling(w: &mut JsonWriter, g: &broca_protocol::Generation, stop_key: Option<&str>) {
    if let Some(t) = g.temperature {
        w.key("temperature").serde(&t);
    }
    if let Some(p) = g.top_p {
        w.key("top_p").serde(&p);
    }
    if let Some(key) = stop_key.filter(|_| !g.stop_sequences.is_empty()) {
        w.key(key).serde(&g.stop_sequences);
    }
}

/// The generation settings as the Google and AWS APIs take them: an object under `object_key`
/// (written only when something is set) with the output limit under `max_key`, then
/// `temperature`, `topP` and `stopSequences`.
pub(crate) fn camel_generation(
    w: &mut JsonWriter,
    g: &broca_protocol::Generation,
    object_key: &str,
    max_key: &str,
) {
    let any = g.max_output_tokens.is_some()
        || g.temperature.is_some()
        || g.top_p.is_some()
        || !g.stop_sequences.is_empty();
    if !any {
        return;
    }
    w.key(object_key).object();
    if let Some(n) = g.max_output_tokens {
        w.key(max_key).u64(n);
    }
    if let Some(t) = g.temperature {
        w.key("temperature").serde(&t);
    }
    if let Some(p) = g.top_p {
        w.key("topP").serde(&p);
    }
    if !g.stop_sequences.is_empty() {
        w.key("stopSequences").serde(&g.stop_sequences);
    }
    w.end_object();
}

/// How each byte is written inside a JSON string: 0 as it is, `u` as `\u00XX`, else the
/// letter after the backslash.
const ESCAPE: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut c = 0;
    while c < 0x20 {
        t[c] = b'u';
        c += 1;
    }
    t[b'\n' as usize] = b'n';
    t[b'\r' as usize] = b'r';
    t[b'\t' as usize] = b't';
    t[0x08] = b'b';
    t[0x0c] = b'f';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// Appends `s` as a JSON string. Eight bytes at a time: a word's candidate bytes (every byte
/// that needs an escape, and rarely a neighbour) are checked against the table; runs between
/// escapes are copied whole.
pub(crate) fn escape_into(out: &mut Vec<u8>, s: &str) {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let b = s.as_bytes();
    out.reserve(b.len() + b.len() / 8 + 2);
    out.push(b'"');
    let mut run = 0; // start of the bytes not yet copied
    let escape = |out: &mut Vec<u8>, run: &mut usize, k: usize| {
        let e = ESCAPE[b[k] as usize];
        if e == 0 {
            return;
        }
        out.extend_from_slice(&b[*run..k]);
        if e == b'u' {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b[k] >> 4) as usize],
                HEX[(b[k] & 15) as usize],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', e]);
        }
        *run = k + 1;
    };
    let mut i = 0;
    while i + 8 <= b.len() {
        let w = u64::from_le_bytes(b[i..i + 8].try_into().expect("eight bytes"));
        let mut m = (w.wrapping_sub(ONES * 0x20) & !w & HIGH)
            | has_zero(w ^ (ONES * b'"' as u64))
            | has_zero(w ^ (ONES * b'\\' as u64));
        while m != 0 {
            escape(out, &mut run, i + (m.trailing_zeros() / 8) as usize);
            m &= m - 1;
        }
        i += 8;
    }
    for k in i..b.len() {
        escape(out, &mut run, k);
    }
    out.extend_from_slice(&b[run..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_as_serde_json_does() {
        let mut all: String = (0u8..0x80).map(char::from).collect();
        all.push_str("é 😀 \u{2028} end");
        for s in [
            "",
            "plain ascii text that is longer than eight bytes",
            "\"",
            "a\"b\\c\nd\re\tf\u{8}g\u{c}h\u{1}i\u{1f}j",
            "fn main() {\n    println!(\"hi\");\n}\n",
            &all,
        ] {
            for start in 0..8.min(s.len() + 1) {
                let Some(s) = s.get(start..) else { continue };
                let mut out = Vec::new();
                escape_into(&mut out, s);
                assert_eq!(
                    String::from_utf8(out).unwrap(),
                    serde_json::to_string(s).unwrap(),
                    "{s:?}"
                );
            }
        }
    }

    #[test]
    fn objects_and_arrays_place_their_commas() {
        let mut w = JsonWriter::with_capacity(0);
        w.object()
            .field_str("a", "x")
            .key("b")
            .array()
            .u64(1)
            .object()
            .key("c")
            .null()
            .key("d")
            .bool(true)
            .end_object()
            .raw("{\"r\":1}")
            .end_array()
            .key("e")
            .serde(&0.5)
            .key("f")
            .object()
            .end_object()
            .end_object();
        assert_eq!(
            String::from_utf8(w.finish()).unwrap(),
            r#"{"a":"x","b":[1,{"c":null,"d":true},{"r":1}],"e":0.5,"f":{}}"#
        );
    }
}

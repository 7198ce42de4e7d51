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
        assert!(self.started.is_empty(), "every object and array is closed");
        assert!(!self.after_key, "every key has its value");
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
        assert!(!self.after_key, "a key is followed by its value");
        assert!(self.started.pop().is_some(), "an object is closed once");
        self.out.push(b'}');
        self
    }

    /// Closes the innermost array.
    pub(crate) fn end_array(&mut self) -> &mut Self {
        assert!(self.started.pop().is_some(), "an array is closed once");
        self.out.push(b']');
        self
    }

    /// Writes a key; its value must follow (the value writes no comma). Keys are the
    /// renderers' own names, which need no escape.
    pub(crate) fn key(&mut self, key: &'static str) -> &mut Self {
        assert!(
            !key.bytes().any(|c| c < 0x20 || c == b'"' || c == b'\\'),
            "a key that needs an escape: {key:?}"
        );
        assert!(!self.after_key, "two keys in a row");
        assert!(!self.started.is_empty(), "a key belongs to an object");
        self.comma();
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
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
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        let mut v = value;
        loop {
            at -= 1;
            digits[at] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.out.extend_from_slice(&digits[at..]);
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

    /// Members already written as JSON by this writer (a held prefix of an array's contents,
    /// [`crate::prefix`]): copied as they are, as one member would be.
    pub(crate) fn members(&mut self, json: &[u8]) -> &mut Self {
        if !json.is_empty() {
            self.comma();
            self.out.extend_from_slice(json);
        }
        self
    }

    /// The bytes written so far.
    pub(crate) fn len(&self) -> usize {
        self.out.len()
    }

    /// The bytes written since `at` (a [`JsonWriter::len`]).
    pub(crate) fn since(&self, at: usize) -> &[u8] {
        &self.out[at..]
    }

    /// Any serializable value (schemas, floats), written by serde_json.
    pub(crate) fn serde<T: serde::Serialize + ?Sized>(&mut self, value: &T) -> &mut Self {
        self.comma();
        serde_json::to_writer(&mut self.out, value).expect("a value serializes");
        self
    }

    /// A string value of `prefix` (a data URL's head: `data:<mime>;base64,`, or nothing) and
    /// the standard base64 of `bytes` (neither needs an escape).
    pub(crate) fn base64(&mut self, prefix: &str, bytes: &[u8]) -> &mut Self {
        self.comma();
        escape_into(&mut self.out, prefix);
        self.out.pop(); // the prefix's closing quote: the string goes on
        self.out
            .extend_from_slice(broca_protocol::media::base64(bytes).as_bytes());
        self.out.push(b'"');
        self
    }

    /// `"key": "value"`.
    pub(crate) fn field_str(&mut self, key: &'static str, value: &str) -> &mut Self {
        self.key(key).str(value)
    }
}

/// The sampling settings every family takes under the same names: `temperature`, `top_p`,
/// and the stop sequences under `stop_key` (when the family has them).
pub(crate) fn sampling(
    w: &mut JsonWriter,
    g: &broca_protocol::Generation,
    stop_key: Option<&'static str>,
) {
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
    object_key: &'static str,
    max_key: &'static str,
    json_schema: Option<&serde_json::Value>,
) {
    let any = json_schema.is_some()
        || g.max_output_tokens.is_some()
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
    // An enforced final-text shape (Gemini's `responseJsonSchema`, JSON output).
    if let Some(schema) = json_schema {
        w.field_str("responseMimeType", "application/json")
            .key("responseJsonSchema")
            .serde(schema);
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

/// The bytes of a sixteen-byte chunk that need an escape in a JSON string (`"`, `\\`, and
/// control characters below 0x20), as a bit mask.
#[cfg(target_arch = "x86_64")]
#[inline]
fn needs_escape16(chunk: &[u8; 16]) -> u32 {
    use std::arch::x86_64::*;
    // SAFETY: SSE2 is part of the x86_64 baseline, so the intrinsics are always available;
    // the unaligned load reads exactly the sixteen bytes `chunk` borrows.
    unsafe {
        let v = _mm_loadu_si128(chunk.as_ptr().cast());
        let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
        let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
        let control = _mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(0x1f)), v);
        _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(quote, backslash), control)) as u32
    }
}

/// Appends `s` as a JSON string. Sixteen bytes at a time (SSE2, on x86_64), or eight (any
/// other target): a chunk's candidate bytes are checked against the table (on x86_64 exactly
/// the bytes that need an escape; in eight-byte words every such byte, and rarely a
/// neighbour); runs between escapes are copied whole.
pub(crate) fn escape_into(out: &mut Vec<u8>, s: &str) {
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
    #[cfg(target_arch = "x86_64")]
    while i + 16 <= b.len() {
        let mut m = needs_escape16(b[i..i + 16].try_into().expect("sixteen bytes"));
        while m != 0 {
            escape(out, &mut run, i + m.trailing_zeros() as usize);
            m &= m - 1;
        }
        i += 16;
    }
    #[cfg(not(target_arch = "x86_64"))]
    while i + 8 <= b.len() {
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
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
    fn every_escape_at_every_position_escapes_as_serde_json_does() {
        for c in (0u8..0x20).chain([b'"', b'\\', 0x7f, b'a']) {
            for len in 0..40 {
                for at in 0..len {
                    let mut bytes = vec![b'x'; len];
                    bytes[at] = c;
                    let s = String::from_utf8(bytes).unwrap();
                    let mut out = Vec::new();
                    escape_into(&mut out, &s);
                    assert_eq!(out, serde_json::to_vec(&s).unwrap(), "{s:?}");
                }
            }
        }
    }

    #[test]
    fn numbers_are_written_as_serde_json_writes_them() {
        for n in [0, 7, 10, 99, 100, 4_294_967_296, u64::MAX] {
            let mut w = JsonWriter::with_capacity(0);
            w.u64(n);
            assert_eq!(w.finish(), serde_json::to_vec(&n).unwrap(), "{n}");
        }
    }

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

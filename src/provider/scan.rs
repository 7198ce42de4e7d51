//! A lazy reader of JSON objects for the normalizers' hot paths: it walks an object's
//! top-level fields, finding string ends with memchr and skipping values it is not asked
//! about, without building anything. It does not validate what it skips: a normalizer uses it
//! only to recognise the few event shapes that carry deltas, and hands everything else (and
//! anything this reader finds odd) to its full serde parse, which is the reference. Strings
//! are taken as they are (a raw control character inside one is not refused).

use std::borrow::Cow;

/// One field's value, as its raw text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Raw<'a> {
    /// A string, with its quotes; `escaped` when it holds a backslash.
    Str { quoted: &'a str, escaped: bool },
    /// An object, with its braces.
    Obj(&'a str),
    /// An array, with its brackets.
    Arr(&'a str),
    /// A number, `true`, `false` or `null`.
    Scalar(&'a str),
}

impl<'a> Raw<'a> {
    /// The string's text, unescaped.
    pub(crate) fn string(self) -> Option<Cow<'a, str>> {
        match self {
            Raw::Str {
                quoted,
                escaped: false,
            } => Some(Cow::Borrowed(&quoted[1..quoted.len() - 1])),
            Raw::Str {
                quoted,
                escaped: true,
            } => unescape(&quoted[1..quoted.len() - 1]).map(Cow::Owned),
            _ => None,
        }
    }

    /// A string without escapes (type tags).
    pub(crate) fn plain(self) -> Option<&'a str> {
        match self {
            Raw::Str {
                quoted,
                escaped: false,
            } => Some(&quoted[1..quoted.len() - 1]),
            _ => None,
        }
    }

    /// A non-negative integer.
    pub(crate) fn u32(self) -> Option<u32> {
        self.digits()?.parse().ok()
    }

    /// A non-negative integer.
    pub(crate) fn u64(self) -> Option<u64> {
        self.digits()?.parse().ok()
    }

    /// A non-negative integer's digits (no sign, fraction, exponent or leading zero).
    fn digits(self) -> Option<&'a str> {
        match self {
            Raw::Scalar(s)
                if s.bytes().all(|c| c.is_ascii_digit())
                    && (s.len() == 1 || !s.starts_with('0')) =>
            {
                Some(s)
            }
            _ => None,
        }
    }

    pub(crate) fn is_null(self) -> bool {
        self == Raw::Scalar("null")
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && matches!(b[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// The first `"` or `\\` at or after `from`: eight bytes at a time for the short strings
/// (keys, tags, ids) that make up most of an event, memchr beyond 64 bytes.
fn quote_or_backslash(b: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let has_zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let mut j = from;
    while j + 8 <= b.len() {
        if j - from >= 64 {
            return memchr::memchr2(b'"', b'\\', &b[j..]).map(|k| j + k);
        }
        let w = u64::from_le_bytes(b[j..j + 8].try_into().expect("eight bytes"));
        // The lowest flagged byte is exact (a borrow only flags bytes above a real match).
        let m = has_zero(w ^ (ONES * b'"' as u64)) | has_zero(w ^ (ONES * b'\\' as u64));
        if m != 0 {
            return Some(j + (m.trailing_zeros() / 8) as usize);
        }
        j += 8;
    }
    b.get(j..)?
        .iter()
        .position(|&c| c == b'"' || c == b'\\')
        .map(|k| j + k)
}

/// The end (one past the closing quote) of the string opening at `i`, and whether it holds
/// an escape.
pub(crate) fn string_end(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let mut j = i + 1;
    let mut escaped = false;
    loop {
        let k = quote_or_backslash(b, j)?;
        if b[k] == b'"' {
            return Some((k + 1, escaped));
        }
        escaped = true;
        j = k + 2;
    }
}

/// The text of a JSON string's contents (without its quotes); `None` for a bad escape.
pub(crate) fn unescape(raw: &str) -> Option<String> {
    let b = raw.as_bytes();
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while let Some(k) = memchr::memchr(b'\\', &b[i..]).map(|k| i + k) {
        out.push_str(raw.get(i..k)?);
        let c = *b.get(k + 1)?;
        i = k + 2;
        match c {
            b'"' => out.push('"'),
            b'\\' => out.push('\\'),
            b'/' => out.push('/'),
            b'b' => out.push('\u{8}'),
            b'f' => out.push('\u{c}'),
            b'n' => out.push('\n'),
            b'r' => out.push('\r'),
            b't' => out.push('\t'),
            b'u' => {
                let hex = |at: usize| u32::from_str_radix(raw.get(at..at + 4)?, 16).ok();
                let hi = hex(i)?;
                i += 4;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    if raw.get(i..i + 2)? != "\\u" {
                        return None;
                    }
                    let lo = hex(i + 2)?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return None;
                    }
                    i += 6;
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                out.push(char::from_u32(code)?);
            }
            _ => return None,
        }
    }
    out.push_str(raw.get(i..)?);
    Some(out)
}

/// The end of the object or array opening at `i`. Only its own kind of bracket is counted:
/// in JSON the other kind nests inside evenly.
fn nested_end(b: &[u8], i: usize) -> Option<usize> {
    let (open, close) = if b[i] == b'{' {
        (b'{', b'}')
    } else {
        (b'[', b']')
    };
    let mut depth = 1usize;
    let mut j = i + 1;
    loop {
        let k = j + memchr::memchr3(b'"', open, close, b.get(j..)?)?;
        match b[k] {
            b'"' => j = string_end(b, k)?.0,
            c if c == open => {
                depth += 1;
                j = k + 1;
            }
            _ => {
                depth -= 1;
                if depth == 0 {
                    return Some(k + 1);
                }
                j = k + 1;
            }
        }
    }
}

/// The value starting at `i` and where it ends.
fn value<'a>(text: &'a str, i: usize) -> Option<(Raw<'a>, usize)> {
    let b = text.as_bytes();
    match *b.get(i)? {
        b'"' => {
            let (end, escaped) = string_end(b, i)?;
            Some((
                Raw::Str {
                    quoted: text.get(i..end)?,
                    escaped,
                },
                end,
            ))
        }
        b'{' => {
            let end = nested_end(b, i)?;
            Some((Raw::Obj(text.get(i..end)?), end))
        }
        b'[' => {
            let end = nested_end(b, i)?;
            Some((Raw::Arr(text.get(i..end)?), end))
        }
        _ => {
            let len = b[i..]
                .iter()
                .position(|c| matches!(c, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))?;
            if len == 0 {
                return None;
            }
            Some((Raw::Scalar(text.get(i..i + len)?), i + len))
        }
    }
}

/// Calls `f` with each top-level field of the object `text`. `None` when `text` is not an
/// object this reader understands (a key with an escape included).
pub(crate) fn fields<'a>(text: &'a str, mut f: impl FnMut(&'a str, Raw<'a>)) -> Option<()> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i = skip_ws(b, i + 1);
    if b.get(i) == Some(&b'}') {
        return (skip_ws(b, i + 1) == b.len()).then_some(());
    }
    loop {
        if b.get(i) != Some(&b'"') {
            return None;
        }
        let (end, escaped) = string_end(b, i)?;
        if escaped {
            return None;
        }
        let key = text.get(i + 1..end - 1)?;
        i = skip_ws(b, end);
        if b.get(i) != Some(&b':') {
            return None;
        }
        let (v, end) = value(text, skip_ws(b, i + 1))?;
        f(key, v);
        i = skip_ws(b, end);
        match b.get(i) {
            Some(b',') => i = skip_ws(b, i + 1),
            Some(b'}') => return (skip_ws(b, i + 1) == b.len()).then_some(()),
            _ => return None,
        }
    }
}

/// A forward reader over one JSON text, for descending into the values a hot path needs
/// while skipping the rest, touching each byte about once. Every method returns `None` on
/// anything it does not expect.
pub(crate) struct Cursor<'a> {
    text: &'a str,
    i: usize,
    /// Inside the current object or array, whether a member was read (a comma comes next).
    started: bool,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(text: &'a str) -> Cursor<'a> {
        Cursor {
            text,
            i: 0,
            started: false,
        }
    }

    /// A cursor inside an object at byte `i` of `text`, where a member was or was not read
    /// (`started`): how a reader resumes after a prefix it has already read.
    pub(crate) fn resume(text: &'a str, i: usize, started: bool) -> Cursor<'a> {
        Cursor { text, i, started }
    }

    /// Where the cursor is, and whether a member was read in the current object.
    pub(crate) fn position(&self) -> (usize, bool) {
        (self.i, self.started)
    }

    fn b(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn peek(&mut self) -> Option<u8> {
        self.i = skip_ws(self.b(), self.i);
        self.b().get(self.i).copied()
    }

    fn open(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| {
            self.i += 1;
            self.started = false;
        })
    }

    /// Enters the object that comes next.
    pub(crate) fn object(&mut self) -> Option<()> {
        self.open(b'{')
    }

    /// Enters the array that comes next.
    pub(crate) fn array(&mut self) -> Option<()> {
        self.open(b'[')
    }

    /// Whether another member follows in the current array or object (consuming the comma),
    /// or `false` after consuming the closing bracket. After it returns `false` the caller is
    /// in the enclosing value, which must be a member that was already started.
    fn more(&mut self, close: u8) -> Option<bool> {
        let c = self.peek()?;
        if c == close {
            self.i += 1;
            self.started = true;
            return Some(false);
        }
        if self.started {
            if c != b',' {
                return None;
            }
            self.i += 1;
        }
        self.started = true;
        Some(true)
    }

    /// The next key of the current object, or `None` inside `Some` at its end.
    pub(crate) fn key(&mut self) -> Option<Option<&'a str>> {
        if !self.more(b'}')? {
            return Some(None);
        }
        if self.peek()? != b'"' {
            return None;
        }
        let (end, escaped) = string_end(self.b(), self.i)?;
        if escaped {
            return None;
        }
        assert!(end > self.i, "a string ends after its quote");
        let key = self.text.get(self.i + 1..end - 1)?;
        self.i = end;
        if self.peek()? != b':' {
            return None;
        }
        self.i += 1;
        Some(Some(key))
    }

    /// Whether another element follows in the current array.
    pub(crate) fn element(&mut self) -> Option<bool> {
        self.more(b']')
    }

    /// The value that comes next, as its raw text (skipped).
    pub(crate) fn value(&mut self) -> Option<Raw<'a>> {
        let at = skip_ws(self.b(), self.i);
        let (v, end) = value(self.text, at)?;
        assert!(
            end >= at && end <= self.text.len(),
            "a value lies inside the text"
        );
        self.i = end;
        Some(v)
    }

    /// Skips the rest of the current object, after which the cursor is past it.
    #[cfg(test)]
    pub(crate) fn finish_object(&mut self) -> Option<()> {
        while self.key()?.is_some() {
            self.value()?;
        }
        Some(())
    }

    /// Skips the rest of the current array.
    pub(crate) fn finish_array(&mut self) -> Option<()> {
        while self.element()? {
            self.value()?;
        }
        Some(())
    }

    /// Whether only white space is left.
    pub(crate) fn at_end(&mut self) -> bool {
        skip_ws(self.b(), self.i) == self.text.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(text: &str) -> Option<Vec<(String, Raw<'_>)>> {
        let mut out = Vec::new();
        fields(text, |k, v| out.push((k.to_string(), v)))?;
        Some(out)
    }

    #[test]
    fn fields_are_read_with_their_raw_values() {
        let text =
            r#" { "a" : "x\"y" , "b":{"c":[1,"}",{"d":"]"}]},"e":[],"f":-1.5e3,"g":null,"h":"" } "#;
        let got = collect(text).unwrap();
        let keys: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "b", "e", "f", "g", "h"]);
        assert_eq!(got[0].1.string().unwrap(), "x\"y");
        assert_eq!(got[1].1, Raw::Obj(r#"{"c":[1,"}",{"d":"]"}]}"#));
        assert_eq!(got[2].1, Raw::Arr("[]"));
        assert_eq!(got[3].1, Raw::Scalar("-1.5e3"));
        assert!(got[4].1.is_null());
        assert_eq!(got[5].1.string().unwrap(), "");
        assert_eq!(collect("{}").unwrap(), vec![]);
    }

    #[test]
    fn odd_or_broken_text_is_declined_never_a_panic() {
        for bad in [
            "",
            "[]",
            "{",
            "{\"a\"",
            "{\"a\":",
            "{\"a\":\"x",
            "{\"a\":1",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{\"a\":{\"b\":1}",
            "{\"k\\u0041\":1}",
            "{\"a\":1}x",
            "{\"a\":\"\\",
            "{\"a\":]}",
        ] {
            assert!(collect(bad).is_none(), "{bad:?}");
        }
        // Every prefix of a valid object is declined without a panic.
        let ok = r#"{"type":"x","delta":{"text":"a\u00e9\"b"},"n":[1,{"m":"}"}]}"#;
        for i in 0..ok.len() {
            if ok.is_char_boundary(i) {
                assert!(collect(&ok[..i]).is_none(), "{}", &ok[..i]);
            }
        }
        assert!(collect(ok).is_some());
    }

    #[test]
    fn the_cursor_descends_and_skips() {
        let text = r#"{"a":1,"b":[{"c":{"d":"x"},"e":[1,2]},3],"f":"y"}"#;
        let mut c = Cursor::new(text);
        c.object().unwrap();
        assert_eq!(c.key().unwrap(), Some("a"));
        assert_eq!(c.value().unwrap(), Raw::Scalar("1"));
        assert_eq!(c.key().unwrap(), Some("b"));
        c.array().unwrap();
        assert!(c.element().unwrap());
        c.object().unwrap();
        assert_eq!(c.key().unwrap(), Some("c"));
        c.object().unwrap();
        assert_eq!(c.key().unwrap(), Some("d"));
        assert_eq!(c.value().unwrap().string().unwrap(), "x");
        assert_eq!(c.key().unwrap(), None);
        c.finish_object().unwrap();
        c.finish_array().unwrap();
        assert_eq!(c.key().unwrap(), Some("f"));
        assert_eq!(c.value().unwrap().string().unwrap(), "y");
        assert_eq!(c.key().unwrap(), None);
        assert!(c.at_end());
        for bad in [r#"{"a":1 "b":2}"#, r#"{"a":1,,"b":2}"#, r#"{"a"1}"#, "{"] {
            let mut c = Cursor::new(bad);
            c.object().unwrap();
            assert!(c.finish_object().is_none(), "{bad}");
        }
    }

    #[test]
    fn string_ends_are_found_at_every_length_and_position() {
        for len in 0..150 {
            for esc in [None, Some(0), Some(len / 2)] {
                let mut body: Vec<u8> = (0..len).map(|k| b'a' + (k % 26) as u8).collect();
                if let Some(at) = esc.filter(|&at| at + 1 < len) {
                    body[at] = b'\\';
                    body[at + 1] = b'"';
                }
                let text = [b"\"".as_slice(), &body, b"\",\"z\":1"].concat();
                let want_esc = esc.is_some_and(|at| at + 1 < len);
                assert_eq!(
                    string_end(&text, 0),
                    Some((len + 2, want_esc)),
                    "len {len} esc {esc:?}"
                );
            }
        }
        assert_eq!(string_end(b"\"abc", 0), None);
        assert_eq!(string_end(b"\"abc\\", 0), None);
    }

    #[test]
    fn unescaping_matches_serde() {
        for q in [
            r#""plain""#,
            r#""a\"b\\c\/d\n\t\r\b\f""#,
            r#""caf\u00e9 \ud83d\ude00 \u0000""#,
            r#""\n\n""#,
            r#""x\u20ACy""#,
        ] {
            let want: String = serde_json::from_str(q).unwrap();
            assert_eq!(
                unescape(&q[1..q.len() - 1]).as_deref(),
                Some(want.as_str()),
                "{q}"
            );
        }
        for bad in [r"\", r"\x", r"\u12", r"\ud83d", r"\ud83d\u0041", r"\uZZZZ"] {
            assert_eq!(unescape(bad), None, "{bad}");
        }
    }
}

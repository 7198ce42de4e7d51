//! The tidy check's reading of a Rust file: comments and literals blanked (so a `{` or an
//! `assert!` inside a string counts for nothing), test items left out, then the measures of
//! what is left: its functions' lengths, its assertions, its `Result<_, String>`s, its
//! `unwrap()`s, its `#[allow(dead_code)]`s and the modules of its crate it names.

/// A production file as the check sees it: each line blanked of comments and literals, the
/// raw lines beside them (attributes are read raw), and the lines of test items.
pub struct Source {
    pub code: Vec<String>,
    pub raw: Vec<String>,
    pub test_lines: Vec<bool>,
}

/// What one file holds, production lines only.
#[derive(Default)]
pub struct Measures {
    /// Non-blank production lines.
    pub lines: usize,
    /// Every line of the file, tests included (the 800-line cap is on the file).
    pub file_lines: usize,
    pub asserts: usize,
    pub string_results: usize,
    pub unwraps: usize,
    pub dead_code_allows: usize,
    /// `(line, name, length)` of each function over the short length.
    pub long_fns: Vec<(usize, String, usize)>,
}

/// A function is long past this many lines (TigerBeetle's 70).
pub const FN_SHORT_MAX: usize = 70;

impl Source {
    pub fn read(text: &str) -> Source {
        let code: Vec<String> = blank(text).split('\n').map(str::to_string).collect();
        let raw: Vec<String> = text.split('\n').map(str::to_string).collect();
        assert_eq!(code.len(), raw.len(), "blanking keeps every newline");
        let mut test_lines = vec![false; code.len()];
        let mut i = 0;
        while i < code.len() {
            if is_test_attr(&code[i]) {
                let end = block_end(&code, i);
                test_lines[i..=end].iter_mut().for_each(|t| *t = true);
                i = end + 1;
                continue;
            }
            i += 1;
        }
        Source {
            code,
            raw,
            test_lines,
        }
    }

    /// The production lines, with their index.
    pub fn production(&self) -> impl Iterator<Item = (usize, &str)> {
        self.code
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.test_lines[*i])
            .map(|(i, l)| (i, l.as_str()))
    }

    pub fn measure(&self) -> Measures {
        let mut m = Measures {
            file_lines: self.raw.len() - usize::from(self.raw.last().is_some_and(|l| l.is_empty())),
            ..Measures::default()
        };
        for (i, line) in self.production() {
            m.lines += usize::from(!line.trim().is_empty());
            m.asserts += count_asserts(line);
            m.string_results += usize::from(is_string_result(line));
            m.unwraps += line.matches(".unwrap()").count();
            m.dead_code_allows += usize::from(
                self.raw[i].contains("allow(dead_code)") && self.raw[i].trim().starts_with("#"),
            );
            if let Some(name) = fn_name(line) {
                let length = block_end(&self.code, i) - i + 1;
                if length > FN_SHORT_MAX {
                    m.long_fns.push((i + 1, name, length));
                }
            }
        }
        m
    }

    /// The production text on one line (for the modules a file names).
    pub fn joined(&self) -> String {
        let mut out = String::new();
        for (_, line) in self.production() {
            out.push_str(line);
            out.push(' ');
        }
        out
    }
}

/// `#[cfg(test)]`, `#[test]` or `#[cfg(all(test, ...))]`, alone on its line.
fn is_test_attr(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with("#[cfg(test)]") || t.starts_with("#[test]") || t.starts_with("#[cfg(all(test")
}

/// `assert!`, `assert_eq!`, `assert_ne!` and their `debug_` forms on a line.
fn count_asserts(line: &str) -> usize {
    let mut n = 0;
    for (at, _) in line.match_indices("assert") {
        let before = line[..at].chars().next_back();
        let word_start = before.is_none_or(|c| !(c.is_alphanumeric() || c == '_'))
            || line[..at].ends_with("debug_");
        let rest = &line[at + "assert".len()..];
        let macro_call =
            rest.starts_with('!') || rest.starts_with("_eq!") || rest.starts_with("_ne!");
        n += usize::from(word_start && macro_call);
    }
    n
}

/// A `Result<..., String>` on the line (an error that is only text).
fn is_string_result(line: &str) -> bool {
    let Some(at) = line.find("Result<") else {
        return false;
    };
    let rest = &line[at..];
    let end = rest.find([';', '{']).unwrap_or(rest.len());
    let sig = &rest[..end];
    sig.match_indices(',').any(|(c, _)| {
        let after = sig[c + 1..].trim_start();
        after.starts_with("String") && after["String".len()..].trim_start().starts_with('>')
    })
}

/// The name of the function a line declares (`pub(crate) async fn name`), if it does.
pub fn fn_name(line: &str) -> Option<String> {
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.peek() {
        let qualifier = *w == "pub"
            || w.starts_with("pub(")
            || matches!(*w, "const" | "async" | "unsafe" | "extern" | "\"C\"");
        if !qualifier {
            break;
        }
        words.next();
    }
    if words.next()? != "fn" {
        return None;
    }
    let name: String = words
        .next()?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The index of the line closing the first brace block opened at or after `start` (a
/// declaration ending in `;` before any brace ends there).
pub fn block_end(lines: &[String], start: usize) -> usize {
    let (mut depth, mut opened) = (0i64, false);
    for (j, line) in lines.iter().enumerate().skip(start) {
        for c in line.chars() {
            match c {
                '{' => {
                    depth += 1;
                    opened = true;
                }
                '}' => depth -= 1,
                ';' if !opened && depth == 0 => return j,
                _ => {}
            }
        }
        if opened && depth == 0 {
            return j;
        }
    }
    lines.len() - 1
}

/// `text` with comments, string literals and char literals blanked; newlines kept.
fn blank(text: &str) -> String {
    let s: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank_to = |out: &mut String, from: usize, to: usize| {
        for &c in &s[from..to] {
            out.push(if c == '\n' { '\n' } else { ' ' });
        }
    };
    while i < s.len() {
        let at = |k: usize, p: &str| p.chars().enumerate().all(|(j, c)| s.get(k + j) == Some(&c));
        if at(i, "//") {
            let j = (i..s.len()).find(|&j| s[j] == '\n').unwrap_or(s.len());
            blank_to(&mut out, i, j);
            i = j;
        } else if at(i, "/*") {
            let (mut depth, mut j) = (1, i + 2);
            while j < s.len() && depth > 0 {
                if at(j, "/*") {
                    depth += 1;
                    j += 2;
                } else if at(j, "*/") {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank_to(&mut out, i, j.min(s.len()));
            i = j;
        } else if let Some(j) = raw_string_end(&s, i) {
            blank_to(&mut out, i, j);
            i = j;
        } else if s[i] == '"' {
            let mut j = i + 1;
            while j < s.len() && s[j] != '"' {
                j += if s[j] == '\\' { 2 } else { 1 };
            }
            let j = (j + 1).min(s.len());
            blank_to(&mut out, i, j);
            i = j;
        } else if let Some(j) = char_literal_end(&s, i) {
            blank_to(&mut out, i, j);
            i = j;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// Where the raw string (`r"…"`, `r#"…"#`, `br"…"`) starting at `i` ends, if one does.
fn raw_string_end(s: &[char], i: usize) -> Option<usize> {
    if i > 0 && (s[i - 1].is_alphanumeric() || s[i - 1] == '_') {
        return None;
    }
    let mut j = i + usize::from(s[i] == 'b');
    if s.get(j) != Some(&'r') {
        return None;
    }
    j += 1;
    let hashes = s[j..].iter().take_while(|&&c| c == '#').count();
    j += hashes;
    if s.get(j) != Some(&'"') {
        return None;
    }
    j += 1;
    while j < s.len() {
        if s[j] == '"'
            && s[j + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes
        {
            return Some((j + 1 + hashes).min(s.len()));
        }
        j += 1;
    }
    Some(s.len())
}

/// Where the char literal (`'a'`, `'\n'`, `'\u{1F600}'`) starting at `i` ends, if one does (a
/// lifetime is not one).
fn char_literal_end(s: &[char], i: usize) -> Option<usize> {
    if s[i] != '\'' {
        return None;
    }
    match (s.get(i + 1), s.get(i + 2)) {
        (Some('\\'), _) => {
            let close = (i + 2..(i + 12).min(s.len())).find(|&j| s[j] == '\'')?;
            Some(close + 1)
        }
        (Some(c), Some('\'')) if *c != '\'' => Some(i + 3),
        _ => None,
    }
}

#[test]
fn the_reading_blanks_literals_and_finds_functions() {
    let src = Source::read(
        "fn a() {\n    let s = \"{ assert!(x) }\";\n    assert!(s.len() > 0);\n}\n\
         // fn b() { assert!(false) }\n#[cfg(test)]\nmod t {\n    fn c() { assert!(true); }\n}\n",
    );
    let m = src.measure();
    assert_eq!(
        m.asserts, 1,
        "the one in code, not the string's, comment's or test's"
    );
    assert_eq!(
        fn_name("pub(crate) async fn drive<T>("),
        Some("drive".into())
    );
    assert_eq!(fn_name("let f = 1;"), None);
    assert!(is_string_result("fn f() -> Result<u8, String> {"));
    assert!(!is_string_result("fn f() -> Result<String, Error> {"));
    assert_eq!(count_asserts("debug_assert_eq!(a, b); reassert!(x)"), 1);
}

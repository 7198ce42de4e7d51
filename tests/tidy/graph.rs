//! The files of a crate as a graph: an edge from a file to each file of the same crate whose
//! module it names (`crate::a::b`, `super::x`, `self::y`, a `use` group's members, a child
//! module used by its name). Naming one's own parent (`super::Thing`) is not an edge: a child
//! is part of its parent. A circle is a strongly connected set of two files or more.

use std::collections::{BTreeMap, BTreeSet};

/// A module path inside its crate (`["machine", "steer"]`; the crate's root is empty).
pub type ModPath = Vec<String>;

/// The modules of a crate and the modules each names.
#[derive(Default)]
pub struct Graph {
    pub edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

impl Graph {
    /// Adds module `from` (its production text on one line) with the edges it names.
    pub fn add(&mut self, from: &ModPath, text: &str) {
        self.edges.entry(from.clone()).or_default();
        let mut named = Vec::new();
        for head in ["crate", "super", "self"] {
            for (at, _) in text.match_indices(head) {
                if let Some(path) = path_at(text, at, head) {
                    named.extend(resolve(from, head, path));
                }
            }
        }
        for child in declared_children(text) {
            if text.contains(&format!("{child}::")) {
                let mut c = from.clone();
                c.push(child);
                named.push(c);
            }
        }
        let set = self.edges.entry(from.clone()).or_default();
        set.extend(named);
    }

    /// The circles: each strongly connected set of two modules or more, edges to a module
    /// not in the crate taken to its nearest enclosing module, edges to an ancestor dropped.
    pub fn circles(&self) -> Vec<Vec<String>> {
        let known: BTreeSet<&ModPath> = self.edges.keys().collect();
        let mut adj: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
        for (from, tos) in &self.edges {
            let mut out = Vec::new();
            for to in tos {
                let mut t = to.clone();
                while !t.is_empty() && !known.contains(&t) {
                    t.pop();
                }
                let Some(t) = known.get(&t) else { continue };
                if *t != from && !from.starts_with(t) {
                    out.push(*t);
                }
            }
            adj.insert(from, out);
        }
        strongly_connected(&adj)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let mut names: Vec<String> = c.iter().map(|m| display(m)).collect();
                names.sort();
                names
            })
            .collect()
    }
}

/// A module path as a person reads it (`machine/steer`, `lib` for the root).
pub fn display(m: &ModPath) -> String {
    if m.is_empty() {
        "lib".into()
    } else {
        m.join("/")
    }
}

/// The `::`-path after the keyword `head` at `at` (`crate::a::b`, with a `{…}` group read as
/// its members), or `None` where `head` is part of a longer word or names nothing.
fn path_at(text: &str, at: usize, head: &str) -> Option<Vec<Vec<String>>> {
    let before = text[..at].chars().next_back();
    if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
        return None;
    }
    let mut rest = &text[at + head.len()..];
    let mut path = Vec::new();
    while let Some(r) = rest.strip_prefix("::") {
        let r = r.trim_start();
        if let Some(group) = r.strip_prefix('{') {
            let inner = &group[..group.find('}').unwrap_or(group.len())];
            let mut out = vec![path.clone()];
            for member in inner.split(',') {
                let member = member.split(" as ").next().unwrap_or("").trim();
                if member.is_empty() || member == "self" {
                    continue;
                }
                let mut p = path.clone();
                p.extend(member.split("::").map(|s| s.trim().to_string()));
                out.push(p);
            }
            return Some(out);
        }
        let word: String = r
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if word.is_empty() {
            break;
        }
        rest = &r[word.len()..];
        path.push(word);
    }
    (!path.is_empty() || head == "super").then_some(vec![path])
}

/// The module paths a reference from `from` names.
fn resolve(from: &ModPath, head: &str, paths: Vec<Vec<String>>) -> Vec<ModPath> {
    let mut out = Vec::new();
    for mut path in paths {
        let mut base: ModPath = match head {
            "crate" => Vec::new(),
            "self" => from.clone(),
            _ => from[..from.len().saturating_sub(1)].to_vec(),
        };
        while path.first().is_some_and(|p| p == "super") {
            base.pop();
            path.remove(0);
        }
        base.extend(path);
        out.push(base);
    }
    out
}

/// The child modules a file declares (`mod x;`, `pub mod x;`).
fn declared_children(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("mod ") {
        let before = text[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &text[at + 4..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = rest.trim_start()[name.len()..].trim_start();
        if !name.is_empty() && after.starts_with(';') {
            out.push(name);
        }
    }
    out
}

/// Tarjan's strongly connected components of `adj`.
fn strongly_connected<'a>(adj: &BTreeMap<&'a ModPath, Vec<&'a ModPath>>) -> Vec<Vec<&'a ModPath>> {
    struct State<'a> {
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        out: Vec<Vec<&'a ModPath>>,
    }
    fn visit<'a>(v: &'a ModPath, adj: &BTreeMap<&'a ModPath, Vec<&'a ModPath>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for &w in adj.get(v).map(Vec::as_slice).unwrap_or(&[]) {
            if !s.index.contains_key(w) {
                visit(w, adj, s);
                let lw = s.low[w];
                s.low.insert(v, s.low[v].min(lw));
            } else if s.on.contains(w) {
                let iw = s.index[w];
                s.low.insert(v, s.low[v].min(iw));
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w);
                if w == v {
                    break;
                }
            }
            s.out.push(comp);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in adj.keys() {
        if !s.index.contains_key(v) {
            visit(v, adj, &mut s);
        }
    }
    s.out
}

#[test]
fn a_circle_is_found_and_a_child_naming_its_parent_is_none() {
    let m = |s: &str| -> ModPath {
        s.split('/')
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect()
    };
    let mut g = Graph::default();
    g.add(&m(""), "mod a; mod b; mod c;");
    g.add(
        &m("a"),
        "use crate::b::{X, Y}; mod inner; fn f() { inner::g() }",
    );
    g.add(&m("a/inner"), "use super::Z; fn g() {}");
    g.add(&m("b"), "fn h() { crate::a::f() }");
    g.add(&m("c"), "use crate::a;");
    assert_eq!(g.circles(), vec![vec!["a".to_string(), "b".to_string()]]);
}

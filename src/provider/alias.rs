//! Tool aliases: a caller's tool name that a provider would reject is rendered under an alias
//! and mapped back when the stream names it. The rule is what every family takes:
//! `[A-Za-z0-9_-]{1,64}` (OpenAI, Anthropic, Bedrock), starting with a letter or `_`
//! (Gemini). Aliases exist only inside rendered requests and normalizers; the WAL keeps the
//! caller's names.

use std::collections::HashMap;
use std::rc::Rc;

use broca_protocol::ToolSpec;

const NAME_MAX: usize = 64;

/// The aliases of one request: both directions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aliases {
    to_wire: Rc<HashMap<String, String>>,
    to_caller: Rc<HashMap<String, String>>,
}

/// Whether providers accept `name` as a tool name.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_MAX
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl Aliases {
    /// Aliases for the tools offered: a valid name is its own; an invalid one becomes its
    /// valid characters (others as `_`, at most 55) plus `_` and 8 hex digits of its blake3,
    /// so the same tool set always renders the same bytes.
    pub fn for_tools(tools: &[ToolSpec]) -> Aliases {
        let mut to_wire = HashMap::new();
        let mut to_caller = HashMap::new();
        for tool in tools.iter().filter(|t| !is_valid_name(&t.name)) {
            let stem: String = tool
                .name
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .take(55)
                .collect();
            // Gemini takes a name only when it starts with a letter or `_`.
            let stem = if stem.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                stem
            } else {
                format!("t{}", &stem[..stem.len().min(54)])
            };
            let hash = blake3::hash(tool.name.as_bytes()).to_hex();
            let alias = format!("{stem}_{}", &hash[..8]);
            to_caller.insert(alias.clone(), tool.name.clone());
            to_wire.insert(tool.name.clone(), alias);
        }
        Aliases {
            to_wire: Rc::new(to_wire),
            to_caller: Rc::new(to_caller),
        }
    }

    /// The name to render for the caller's `name`.
    pub fn wire<'a>(&'a self, name: &'a str) -> &'a str {
        self.to_wire.get(name).map(String::as_str).unwrap_or(name)
    }

    /// The caller's name for a name the provider streamed.
    pub fn caller(&self, name: String) -> String {
        match self.to_caller.get(&name) {
            Some(caller) => caller.clone(),
            None => name,
        }
    }

    /// Whether no tool needed an alias.
    pub fn is_empty(&self) -> bool {
        self.to_wire.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            route: String::new(),
            reply: None,
        }
    }

    #[test]
    fn only_names_a_provider_would_reject_get_a_stable_alias() {
        let long = "x".repeat(70);
        let tools = [spec("read_file"), spec("fs.read file"), spec(&long)];
        let a = Aliases::for_tools(&tools);
        assert_eq!(a.wire("read_file"), "read_file");
        let dotted = a.wire("fs.read file").to_string();
        assert!(
            dotted.starts_with("fs_read_file_") && is_valid_name(&dotted),
            "{dotted}"
        );
        let l = a.wire(&long).to_string();
        assert!(is_valid_name(&l) && l.len() == 64, "{l}");
        assert_eq!(a.caller(dotted.clone()), "fs.read file");
        assert_eq!(a.caller("read_file".into()), "read_file");
        assert_eq!(
            Aliases::for_tools(&tools),
            a,
            "the same tools give the same aliases"
        );
    }

    #[test]
    fn a_name_starting_with_a_digit_or_dash_gets_one_gemini_takes() {
        let tools = [spec("2fa-code"), spec("-x"), spec("_ok")];
        let a = Aliases::for_tools(&tools);
        for name in ["2fa-code", "-x"] {
            let w = a.wire(name).to_string();
            assert!(
                w.starts_with('t') && is_valid_name(&w) && w.len() <= 64,
                "{w}"
            );
            assert_eq!(a.caller(w), name);
        }
        assert_eq!(a.wire("_ok"), "_ok");
    }
}

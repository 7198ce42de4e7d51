//! Checks a tool call's arguments against the tool's input schema before dispatch: arguments
//! that do not match are recorded as an error result and never sent.
//!
//! The schema is JSON Schema as the tool states it (its `$schema`, else draft 2020-12),
//! checked by the `jsonschema` crate: every assertion keyword (`$ref` inside the schema,
//! `pattern`, combinators, bounds, ...), with `format` an annotation and no reference fetched
//! from the network or files. A schema that does not compile (one referring outside itself,
//! say) refuses nothing: the server still validates what it receives.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use serde_json::Value;

/// Where and how arguments do not match their schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The JSON pointer of the value at fault (`/` for the arguments themselves).
    pub path: String,
    pub why: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}`: {}", self.path, self.why)
    }
}

impl Mismatch {
    /// Whether the mismatch's text holds `part`.
    pub fn contains(&self, part: &str) -> bool {
        self.to_string().contains(part)
    }
}

/// Schemas compiled on this thread, at most this many (then they are compiled afresh).
const COMPILED_MAX: usize = 1024;

type Compiled = Option<Rc<jsonschema::Validator>>;

thread_local! {
    /// A tool's schema is compiled once, not per call: keyed by where the schema lives (a
    /// run's frozen tool specs), and checked equal to a copy, so a schema changed or freed
    /// and another put in its place is compiled afresh.
    static COMPILED: RefCell<HashMap<usize, (Value, Compiled)>> = RefCell::new(HashMap::new());
}

/// `schema` compiled (`None`: it does not compile).
fn compiled(schema: &Value) -> Compiled {
    let key = schema as *const Value as usize;
    COMPILED.with(|c| {
        if let Some((held, v)) = c.borrow().get(&key) {
            if held == schema {
                return v.clone();
            }
        }
        let v = jsonschema::options()
            .should_validate_formats(false)
            .build(schema)
            .ok()
            .map(Rc::new);
        let mut c = c.borrow_mut();
        if c.len() >= COMPILED_MAX {
            c.clear();
        }
        c.insert(key, (schema.clone(), v.clone()));
        v
    })
}

/// `Ok` when `args` matches `schema`; otherwise where and how it does not (the first
/// mismatch found), e.g. "`/city`: 12 is not of type \"string\"".
pub fn validate(schema: &Value, args: &Value) -> Result<(), Mismatch> {
    let Some(validator) = compiled(schema) else {
        return Ok(());
    };
    let first = validator.iter_errors(args).next().map(|e| {
        let path = e.instance_path().as_str();
        Mismatch {
            path: if path.is_empty() {
                "/".into()
            } else {
                path.to_string()
            },
            why: e.to_string(),
        }
    });
    first.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}
            },
            "required": ["city"],
            "additionalProperties": false
        })
    }

    #[test]
    fn matching_arguments_pass() {
        for args in [
            json!({"city": "Paris"}),
            json!({"city": "Paris", "unit": "celsius", "days": 3, "tags": ["a"]}),
            json!({"city": "Paris", "days": 3.0}),
        ] {
            assert_eq!(validate(&weather(), &args), Ok(()), "{args}");
        }
        // No schema to speak of: anything that is an object passes.
        assert_eq!(validate(&json!({}), &json!({"x": [1, 2]})), Ok(()));
        assert_eq!(validate(&json!({"type": "object"}), &json!({})), Ok(()));
    }

    #[test]
    fn mismatches_name_the_place_and_the_problem() {
        for (args, want) in [
            (json!({}), "`/`: \"city\" is a required property"),
            (json!({"city": 12}), "`/city`: 12 is not of type \"string\""),
            (
                json!({"city": ""}),
                "`/city`: \"\" is shorter than 1 character",
            ),
            (
                json!({"city": "P", "unit": "kelvin"}),
                "`/unit`: \"kelvin\" is not one of",
            ),
            (
                json!({"city": "P", "days": 9}),
                "`/days`: 9 is greater than the maximum of 7",
            ),
            (
                json!({"city": "P", "days": 1.5}),
                "`/days`: 1.5 is not of type \"integer\"",
            ),
            (
                json!({"city": "P", "tags": ["a", 2]}),
                "`/tags/1`: 2 is not of type \"string\"",
            ),
            (
                json!({"city": "P", "tags": ["a", "b", "c"]}),
                "has more than 2 items",
            ),
            (
                json!({"city": "P", "extra": true}),
                "`/`: Additional properties are not allowed ('extra' was unexpected)",
            ),
            (json!("Paris"), "`/`: \"Paris\" is not of type \"object\""),
        ] {
            let err = validate(&weather(), &args).unwrap_err();
            assert!(err.contains(want), "{args}: {err}");
        }
    }

    #[test]
    fn a_schema_changed_in_place_is_compiled_afresh() {
        // The same place holds one schema, then another: each call checks the one it holds.
        let mut schema = Box::new(weather());
        let args = json!({"city": 12});
        assert!(validate(&schema, &args).is_err());
        assert!(validate(&schema, &args).is_err(), "the compiled one, again");
        *schema = json!({"type": "object"});
        assert_eq!(validate(&schema, &args), Ok(()));
        *schema = weather();
        assert!(validate(&schema, &args).is_err());
    }

    #[test]
    fn combinators_are_checked() {
        let s = json!({"anyOf": [{"type": "string"}, {"type": "integer"}]});
        assert!(validate(&s, &json!("x")).is_ok());
        assert!(validate(&s, &json!(3)).is_ok());
        assert!(validate(&s, &json!(true)).is_err());
        let one = json!({"oneOf": [{"type": "number"}, {"type": "integer"}]});
        assert!(validate(&one, &json!(1))
            .unwrap_err()
            .contains("valid under more than one"));
        let not = json!({"not": {"type": "null"}});
        assert!(validate(&not, &json!(null)).is_err());
        // References inside the schema and patterns are checked, in the tool's own draft.
        let r = json!({"$defs": {"x": {"type": "string", "pattern": "^a"}}, "$ref": "#/$defs/x"});
        assert!(validate(&r, &json!("abc")).is_ok());
        assert!(validate(&r, &json!("zzz"))
            .unwrap_err()
            .contains("does not match \"^a\""));
        let draft7 = json!({"$schema": "http://json-schema.org/draft-07/schema#",
            "definitions": {"x": {"type": "string"}}, "properties": {"a": {"$ref": "#/definitions/x"}}});
        assert!(validate(&draft7, &json!({"a": 1}))
            .unwrap_err()
            .contains("`/a`"));
        // `format` is an annotation; a schema referring outside itself refuses nothing.
        assert!(validate(&json!({"format": "email"}), &json!("not an email")).is_ok());
        let outside = json!({"$ref": "https://example.com/s.json"});
        assert!(validate(&outside, &json!(1)).is_ok());
    }
}

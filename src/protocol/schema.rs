//! Checks a tool call's arguments against the tool's input schema before dispatch: arguments
//! that do not match are recorded as an error result and never sent.
//!
//! The JSON Schema keywords tool servers use for arguments are checked: `type`, `properties`,
//! `required`, `additionalProperties`, `items`, `enum`, `const`, `minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum`, `minLength`, `maxLength`, `minItems`, `maxItems`,
//! `allOf`, `anyOf`, `oneOf`, `not`. Other keywords (`$ref`, `pattern`, `format`, ...) are
//! not checked: an argument is refused only for a mismatch this module can name, and the
//! server still validates what it receives.

use serde_json::{Map, Value};

/// Nesting beyond this is not checked (a guard against pathological schemas).
const DEPTH_MAX: usize = 64;

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

/// `Ok` when `args` matches `schema`; otherwise where and how it does not, e.g.
/// "`/city`: expected a string, found 12".
pub fn validate(schema: &Value, args: &Value) -> Result<(), Mismatch> {
    check(schema, args, &mut String::new(), 0)
}

fn check(schema: &Value, v: &Value, path: &mut String, depth: usize) -> Result<(), Mismatch> {
    let Some(s) = schema.as_object() else {
        return match schema {
            Value::Bool(false) => Err(at(path, "no value is allowed here")),
            _ => Ok(()),
        };
    };
    if depth > DEPTH_MAX {
        return Ok(());
    }
    allowed_values(s, v, path)?;
    match v {
        Value::Object(o) => object(s, o, path, depth)?,
        Value::Array(items) => array(s, items, path, depth)?,
        Value::String(text) => string(s, text, path)?,
        Value::Number(num) => number(s, num.as_f64().unwrap_or(f64::NAN), path)?,
        _ => {}
    }
    combinators(s, v, path, depth)
}

/// `type`, `enum` and `const`.
fn allowed_values(s: &Map<String, Value>, v: &Value, path: &str) -> Result<(), Mismatch> {
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(name) => has_type(v, name),
            Value::Array(names) => names
                .iter()
                .any(|n| n.as_str().is_some_and(|n| has_type(v, n))),
            _ => true,
        };
        if !ok {
            return Err(at(
                path,
                &format!("expected {}, found {}", describe_type(t), short(v)),
            ));
        }
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array) {
        if !allowed.iter().any(|a| same(a, v)) {
            let list: Vec<String> = allowed.iter().map(short).collect();
            return Err(at(
                path,
                &format!("{} is not one of {}", short(v), list.join(", ")),
            ));
        }
    }
    match s.get("const") {
        Some(c) if !same(c, v) => Err(at(
            path,
            &format!("expected {}, found {}", short(c), short(v)),
        )),
        _ => Ok(()),
    }
}

/// `minLength` and `maxLength`, in characters.
fn string(s: &Map<String, Value>, text: &str, path: &str) -> Result<(), Mismatch> {
    let n = text.chars().count() as u64;
    if let Some(min) = s.get("minLength").and_then(Value::as_u64) {
        if n < min {
            return Err(at(path, &format!("at least {min} characters, found {n}")));
        }
    }
    if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
        if n > max {
            return Err(at(path, &format!("at most {max} characters, found {n}")));
        }
    }
    Ok(())
}

/// `allOf`, `anyOf`, `oneOf` and `not`.
fn combinators(
    s: &Map<String, Value>,
    v: &Value,
    path: &mut String,
    depth: usize,
) -> Result<(), Mismatch> {
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for sub in all {
            check(sub, v, path, depth + 1)?;
        }
    }
    if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
        let mut first = None;
        if !any.iter().any(|sub| match check(sub, v, path, depth + 1) {
            Ok(()) => true,
            Err(e) => {
                first.get_or_insert(e);
                false
            }
        }) {
            return Err(first.unwrap_or_else(|| at(path, "matches none of anyOf")));
        }
    }
    if let Some(one) = s.get("oneOf").and_then(Value::as_array) {
        let matching = one
            .iter()
            .filter(|sub| check(sub, v, path, depth + 1).is_ok())
            .count();
        if matching != 1 {
            return Err(at(
                path,
                &format!("must match exactly one of oneOf; matches {matching}"),
            ));
        }
    }
    match s.get("not") {
        Some(not) if check(not, v, path, depth + 1).is_ok() => {
            Err(at(path, "matches a schema it must not"))
        }
        _ => Ok(()),
    }
}

fn object(
    s: &Map<String, Value>,
    o: &Map<String, Value>,
    path: &mut String,
    depth: usize,
) -> Result<(), Mismatch> {
    if let Some(required) = s.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !o.contains_key(name) {
                return Err(at(path, &format!("`{name}` is required")));
            }
        }
    }
    let props = s.get("properties").and_then(Value::as_object);
    let extra = s.get("additionalProperties");
    for (key, value) in o {
        let len = path.len();
        path.push('/');
        path.push_str(key);
        let result = match props.and_then(|p| p.get(key)) {
            Some(sub) => check(sub, value, path, depth + 1),
            None => match extra {
                Some(Value::Bool(false)) => Err(at(path, "is not a known property")),
                Some(sub @ Value::Object(_)) => check(sub, value, path, depth + 1),
                _ => Ok(()),
            },
        };
        path.truncate(len);
        result?;
    }
    Ok(())
}

fn array(
    s: &Map<String, Value>,
    items: &[Value],
    path: &mut String,
    depth: usize,
) -> Result<(), Mismatch> {
    let n = items.len() as u64;
    if let Some(min) = s.get("minItems").and_then(Value::as_u64) {
        if n < min {
            return Err(at(path, &format!("at least {min} items, found {n}")));
        }
    }
    if let Some(max) = s.get("maxItems").and_then(Value::as_u64) {
        if n > max {
            return Err(at(path, &format!("at most {max} items, found {n}")));
        }
    }
    if let Some(item_schema) = s.get("items").filter(|i| i.is_object() || i.is_boolean()) {
        for (i, item) in items.iter().enumerate() {
            let len = path.len();
            path.push_str(&format!("/{i}"));
            let result = check(item_schema, item, path, depth + 1);
            path.truncate(len);
            result?;
        }
    }
    Ok(())
}

fn number(s: &Map<String, Value>, x: f64, path: &str) -> Result<(), Mismatch> {
    let bound = |k: &str| s.get(k).and_then(Value::as_f64);
    let checks: [(&str, fn(f64, f64) -> bool, &str); 4] = [
        ("minimum", |x, b| x >= b, "at least"),
        ("maximum", |x, b| x <= b, "at most"),
        ("exclusiveMinimum", |x, b| x > b, "more than"),
        ("exclusiveMaximum", |x, b| x < b, "less than"),
    ];
    for (key, ok, words) in checks {
        if let Some(b) = bound(key) {
            if !ok(x, b) {
                return Err(at(path, &format!("must be {words} {b}, found {x}")));
            }
        }
    }
    Ok(())
}

fn has_type(v: &Value, name: &str) -> bool {
    match name {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        "number" => v.is_number(),
        "integer" => {
            v.as_i64().is_some()
                || v.as_u64().is_some()
                || v.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => true, // an unknown type name is not ours to refuse
    }
}

/// Numbers compare by value (1 and 1.0 are the same), everything else structurally.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn describe_type(t: &Value) -> String {
    match t {
        Value::String(n) => article(n),
        Value::Array(ns) => ns
            .iter()
            .filter_map(Value::as_str)
            .map(article)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "another type".into(),
    }
}

fn article(n: &str) -> String {
    match n {
        "object" | "array" | "integer" => format!("an {n}"),
        "null" => "null".into(),
        _ => format!("a {n}"),
    }
}

/// A value shown in an error, cut short.
fn short(v: &Value) -> String {
    let text = v.to_string();
    if text.len() <= 60 {
        return text;
    }
    let mut end = 57;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

fn at(path: &str, what: &str) -> Mismatch {
    let path = if path.is_empty() { "/" } else { path };
    Mismatch {
        path: path.to_string(),
        why: what.to_string(),
    }
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
            (json!({}), "`/`: `city` is required"),
            (json!({"city": 12}), "`/city`: expected a string, found 12"),
            (json!({"city": ""}), "`/city`: at least 1 characters"),
            (
                json!({"city": "P", "unit": "kelvin"}),
                "`/unit`: \"kelvin\" is not one of",
            ),
            (
                json!({"city": "P", "days": 9}),
                "`/days`: must be at most 7",
            ),
            (
                json!({"city": "P", "days": 1.5}),
                "`/days`: expected an integer",
            ),
            (
                json!({"city": "P", "tags": ["a", 2]}),
                "`/tags/1`: expected a string",
            ),
            (
                json!({"city": "P", "tags": ["a", "b", "c"]}),
                "at most 2 items",
            ),
            (
                json!({"city": "P", "extra": true}),
                "`/extra`: is not a known property",
            ),
            (json!("Paris"), "`/`: expected an object, found \"Paris\""),
        ] {
            let err = validate(&weather(), &args).unwrap_err();
            assert!(err.contains(want), "{args}: {err}");
        }
    }

    #[test]
    fn combinators_are_checked() {
        let s = json!({"anyOf": [{"type": "string"}, {"type": "integer"}]});
        assert!(validate(&s, &json!("x")).is_ok());
        assert!(validate(&s, &json!(3)).is_ok());
        assert!(validate(&s, &json!(true)).is_err());
        let one = json!({"oneOf": [{"type": "number"}, {"type": "integer"}]});
        assert!(validate(&one, &json!(1)).unwrap_err().contains("matches 2"));
        let not = json!({"not": {"type": "null"}});
        assert!(validate(&not, &json!(null)).is_err());
        // Keywords not checked here never refuse.
        let r = json!({"$ref": "#/definitions/x", "pattern": "^a"});
        assert!(validate(&r, &json!("zzz")).is_ok());
    }
}

//! Schema-shaped run output (llm-runner/v1 `structured_output`), sans-IO: what admission
//! freezes (the schema's JCS text, the mode, whether the route enforces it and why not), the
//! `submit_result` tool, how each wire family takes a schema, and the validation of what the
//! run produced (JSON Schema draft 2020-12 by the `jsonschema` crate, `format` never
//! asserted, no reference resolved outside the document).

use crate::family::Family;
use std::sync::Arc;

use crate::{OutputShape, ToolSpec};
use cortexkit_role_llm_runner::structured_output::{
    enforcement, modes, reasons, validation, Mode, SkippedSibling, StructuredOutput,
    StructuredOutputResult, SUBMIT_RESULT_TOOL,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A run's `structured_output`, as admission froze it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrozenStructuredOutput {
    /// `final_text` or `submit_tool`.
    pub mode: String,
    /// The name a provider is given (`result` when the send named none).
    pub name: String,
    /// The caller's schema, its RFC 8785 (JCS) text: what the output is validated against.
    pub schema: String,
    /// `enforced` or `best_effort`.
    pub enforcement: String,
    /// Why not enforced (`best_effort` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The schema as a provider's strict mode takes it (enforced only): the caller's, its
    /// objects closed to other members where the route asks for that (every output it
    /// allows is one the caller's schema allows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict_schema: Option<String>,
}

/// The description of the `submit_result` tool the run offers in `submit_tool` mode.
pub const SUBMIT_DESCRIPTION: &str = "Submit the task's result. Its input is the result, shaped \
     by this tool's schema. Calling it ends the task: call it once, when the result is final.";

/// Why admission refuses a `structured_output`: the `invalid_params` field it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub field: &'static str,
    pub why: String,
}

fn refused(field: &'static str, why: impl Into<String>) -> Refused {
    Refused {
        field,
        why: why.into(),
    }
}

/// Which modes a wire family, as broca speaks it, can ask its provider to enforce:
/// `(final text, tool input)` (a family this build does not speak, neither).
fn family_enforces(family: &str) -> (bool, bool) {
    Family::parse(family).map_or((false, false), Family::enforces)
}

/// Freezes a send's `structured_output` for a run of `family` (the catalog row saying
/// `catalog_support`) whose admitted tools are `tools`, or refuses it. Checks in the role's
/// order: the reserved tool name, `final_text` beside tools, then a schema that does not
/// compile.
pub fn admit(
    raw: &Value,
    tools: &[&str],
    family: &str,
    catalog_support: Option<bool>,
) -> Result<FrozenStructuredOutput, Refused> {
    let so: StructuredOutput = serde_json::from_value(raw.clone())
        .map_err(|e| refused("structured_output", format!("structured_output: {e}")))?;
    if let Err(field) = so.check(true, tools) {
        return Err(if field == "structured_output" {
            refused(
                "structured_output",
                format!(
                    "`{SUBMIT_RESULT_TOOL}` is reserved: the run's tools include one of that name"
                ),
            )
        } else {
            refused(
                "structured_output.mode",
                "final_text needs a run without tools (use submit_tool beside tools)",
            )
        });
    }
    compile(&so.schema).map_err(|e| {
        refused(
            "structured_output.schema",
            format!("the schema does not compile: {e}"),
        )
    })?;
    let jcs = so.schema_jcs().map_err(|_| {
        refused(
            "structured_output.schema",
            "the schema has no canonical form",
        )
    })?;
    let schema = String::from_utf8(jcs).expect("JCS text is UTF-8");
    let (enforced, reason, strict) = decide(so.mode, family, catalog_support, &so.schema);
    Ok(FrozenStructuredOutput {
        mode: so.mode.as_str().to_string(),
        name: so.effective_name().to_string(),
        schema,
        enforcement: if enforced {
            enforcement::ENFORCED
        } else {
            enforcement::BEST_EFFORT
        }
        .to_string(),
        reason: reason.map(str::to_string),
        strict_schema: strict.map(|s| s.to_string()),
    })
}

/// Whether the run's route enforces the mode, why not, and the schema in its strict form.
fn decide(
    mode: Mode,
    family: &str,
    catalog_support: Option<bool>,
    schema: &Value,
) -> (bool, Option<&'static str>, Option<Value>) {
    match catalog_support {
        None => return (false, Some(reasons::CATALOG_UNKNOWN), None),
        Some(false) => return (false, Some(reasons::ROUTE_UNSUPPORTED), None),
        Some(true) => {}
    }
    let (final_text, tool_input) = family_enforces(family);
    if !final_text && !tool_input {
        return (false, Some(reasons::ROUTE_UNSUPPORTED), None);
    }
    let this_mode = match mode {
        Mode::SubmitTool => tool_input,
        _ => final_text,
    };
    if !this_mode {
        return (false, Some(reasons::MODE_NOT_ENFORCEABLE), None);
    }
    match strict_form(family, schema) {
        Some(strict) => (true, None, Some(strict)),
        None => (false, Some(reasons::SCHEMA_OUTSIDE_SUBSET), None),
    }
}

/// The keywords every family's strict mode takes.
const SUBSET: &[&str] = &[
    "type",
    "properties",
    "required",
    "items",
    "enum",
    "const",
    "anyOf",
    "description",
    "title",
    "$defs",
    "$ref",
    "additionalProperties",
];

/// The schema as `family`'s strict mode takes it, or `None` when it is outside the family's
/// subset. The root must be an object schema; every object is closed to other members
/// (`additionalProperties: false`, also where the caller left it open by default), and on
/// OpenAI's routes every property is required. Both only narrow: every value the strict form
/// allows, the caller's schema allows.
pub fn strict_form(family: &str, schema: &Value) -> Option<Value> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return None;
    }
    let subset = Family::parse(family)?.strict_subset();
    let mut out = schema.clone();
    if let Value::Object(root) = &mut out {
        root.remove("$schema");
    }
    narrow(&mut out, subset.all_required, subset.gemini_keywords).then_some(out)
}

fn narrow(schema: &mut Value, all_required: bool, gemini: bool) -> bool {
    let Value::Object(map) = schema else {
        return schema.is_boolean() && schema == &Value::Bool(true);
    };
    let extra: &[&str] = if gemini {
        &["minimum", "maximum", "minItems", "maxItems", "format"]
    } else {
        &[]
    };
    if map
        .keys()
        .any(|k| !SUBSET.contains(&k.as_str()) && !extra.contains(&k.as_str()))
    {
        return false;
    }
    if let Some(props) = map.get("properties") {
        if !props.is_object() {
            return false;
        }
    }
    let is_object = map.get("type").and_then(Value::as_str) == Some("object");
    match map.get("additionalProperties") {
        None | Some(Value::Bool(false)) => {}
        Some(_) => return false,
    }
    if is_object && !gemini {
        map.insert("additionalProperties".into(), Value::Bool(false));
        if !map.contains_key("properties") {
            map.insert("properties".into(), Value::Object(Map::new()));
        }
    }
    if is_object && all_required {
        let names: Vec<Value> = map["properties"]
            .as_object()
            .map(|p| p.keys().map(|k| Value::String(k.clone())).collect())
            .unwrap_or_default();
        map.insert("required".into(), Value::Array(names));
    }
    for key in ["properties", "$defs"] {
        if let Some(Value::Object(children)) = map.get_mut(key) {
            if !children
                .values_mut()
                .all(|c| narrow(c, all_required, gemini))
            {
                return false;
            }
        }
    }
    if let Some(items) = map.get_mut("items") {
        if !narrow(items, all_required, gemini) {
            return false;
        }
    }
    if let Some(Value::Array(any)) = map.get_mut("anyOf") {
        if !any.iter_mut().all(|c| narrow(c, all_required, gemini)) {
            return false;
        }
    }
    true
}

fn compile(schema: &Value) -> Result<jsonschema::Validator, jsonschema::ValidationError<'static>> {
    jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .should_validate_formats(false)
        .build(schema)
}

/// What a run admitted with `so` sends: the `submit_result` tool (submit_tool mode), the
/// shape its provider enforces, and the instruction that carries the schema where nothing
/// enforces it (best-effort final text).
pub struct Rendering {
    pub submit_tool: Option<ToolSpec>,
    pub shape: Option<Arc<OutputShape>>,
    pub instruction: Option<String>,
}

/// How a run with `so` renders its requests, from the frozen bytes only.
pub fn rendering(so: &FrozenStructuredOutput) -> Rendering {
    let caller: Value = serde_json::from_str(&so.schema).unwrap_or(Value::Null);
    let strict: Option<Value> = so
        .strict_schema
        .as_deref()
        .and_then(|s| serde_json::from_str(s).ok());
    if so.mode == modes::SUBMIT_TOOL {
        let enforced = strict.is_some();
        return Rendering {
            submit_tool: Some(ToolSpec {
                name: SUBMIT_RESULT_TOOL.to_string(),
                description: SUBMIT_DESCRIPTION.to_string(),
                input_schema: strict.unwrap_or(caller),
                route: String::new(),
                reply: None,
            }),
            shape: enforced.then(|| {
                Arc::new(OutputShape {
                    name: so.name.clone(),
                    final_text: None,
                    strict_tool: Some(SUBMIT_RESULT_TOOL.to_string()),
                })
            }),
            instruction: None,
        };
    }
    match strict {
        Some(strict) => Rendering {
            submit_tool: None,
            shape: Some(Arc::new(OutputShape {
                name: so.name.clone(),
                final_text: Some(strict),
                strict_tool: None,
            })),
            instruction: None,
        },
        None => Rendering {
            submit_tool: None,
            shape: None,
            instruction: Some(format!(
                "Answer with a single JSON value and nothing else: no prose, no code fence. \
                 It must match this JSON Schema (named `{}`):\n{}",
                so.name, so.schema
            )),
        },
    }
}

/// The result of a run that ends `completed` in `final_text` mode: its final text parsed
/// and validated.
pub fn final_text_result(so: &FrozenStructuredOutput, text: &str) -> StructuredOutputResult {
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(value) => validated(so, value, None),
        Err(e) => failed(
            so,
            None,
            vec![format!("the final text is not JSON: {e}")],
            None,
        ),
    }
}

/// The result of a step whose first `submit_result` call carried `arguments`, its other
/// calls `skipped`.
pub fn submitted_result(
    so: &FrozenStructuredOutput,
    arguments: &str,
    skipped: Vec<SkippedSibling>,
) -> StructuredOutputResult {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value) => validated(so, value, Some(skipped)),
        Err(e) => failed(
            so,
            None,
            vec![format!("the submitted arguments are not JSON: {e}")],
            Some(skipped),
        ),
    }
}

/// The result of a run that ended without a value.
pub fn absent_result(so: &FrozenStructuredOutput) -> StructuredOutputResult {
    let skipped = (so.mode == modes::SUBMIT_TOOL).then(Vec::new);
    base(so, validation::ABSENT, skipped)
}

fn base(
    so: &FrozenStructuredOutput,
    state: &str,
    skipped: Option<Vec<SkippedSibling>>,
) -> StructuredOutputResult {
    let mut r = StructuredOutputResult::new(&so.mode, &so.enforcement, state);
    if let Some(reason) = &so.reason {
        r = r.with_reason(reason);
    }
    if let Some(skipped) = skipped {
        r = r.with_skipped_siblings(skipped);
    }
    r
}

fn validated(
    so: &FrozenStructuredOutput,
    value: Value,
    skipped: Option<Vec<SkippedSibling>>,
) -> StructuredOutputResult {
    let schema: Value = serde_json::from_str(&so.schema).unwrap_or(Value::Null);
    let errors: Vec<String> = match compile(&schema) {
        Ok(v) => v
            .iter_errors(&value)
            .map(|e| format!("{}: {e}", pointer(e.instance_path().as_str())))
            .collect(),
        Err(e) => vec![format!("the frozen schema no longer compiles: {e}")],
    };
    if errors.is_empty() {
        base(so, validation::PASSED, skipped).with_value(value)
    } else {
        failed(so, Some(value), errors, skipped)
    }
}

/// The JSON Pointer of an instance location, `/` for the root.
fn pointer(path: &str) -> &str {
    if path.is_empty() {
        "/"
    } else {
        path
    }
}

fn failed(
    so: &FrozenStructuredOutput,
    value: Option<Value>,
    errors: Vec<String>,
    skipped: Option<Vec<SkippedSibling>>,
) -> StructuredOutputResult {
    // `with_errors` bounds them (at most 32 of at most 256 bytes) and flags a cut.
    let r = base(so, validation::FAILED, skipped).with_errors(errors);
    match value {
        Some(value) => r.with_value(value),
        None => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]})
    }

    fn frozen(mode: &str, family: &str, support: Option<bool>) -> FrozenStructuredOutput {
        admit(
            &json!({"mode": mode, "schema": schema()}),
            &[],
            family,
            support,
        )
        .or_else(|_| {
            admit(
                &json!({"mode": mode, "schema": schema()}),
                &["t"],
                family,
                support,
            )
        })
        .unwrap()
    }

    #[test]
    fn enforcement_follows_the_catalog_the_family_and_the_subset() {
        let so = frozen("final_text", "anthropic-messages", Some(true));
        assert_eq!((so.enforcement.as_str(), so.reason), ("enforced", None));
        let strict: Value = serde_json::from_str(so.strict_schema.as_deref().unwrap()).unwrap();
        assert_eq!(strict["additionalProperties"], json!(false));
        let so = frozen("final_text", "anthropic-messages", None);
        assert_eq!(so.reason.as_deref(), Some("catalog_unknown"));
        let so = frozen("submit_tool", "anthropic-messages", Some(false));
        assert_eq!(so.reason.as_deref(), Some("route_unsupported"));
        let so = frozen("submit_tool", "gemini", Some(true));
        assert_eq!(so.reason.as_deref(), Some("mode_not_enforceable"));
        let open = json!({"type": "object", "additionalProperties": {"type": "string"}});
        let so = admit(
            &json!({"mode": "final_text", "schema": open}),
            &[],
            "openai-chat",
            Some(true),
        )
        .unwrap();
        assert_eq!(so.reason.as_deref(), Some("schema_outside_subset"));
        // OpenAI's strict form requires every property; the caller's optional one is.
        let loose = json!({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "integer"}}});
        let strict = strict_form("openai-chat", &loose).unwrap();
        assert_eq!(strict["required"], json!(["a", "b"]));
    }

    #[test]
    fn admission_refuses_by_the_field_the_role_names() {
        let so = json!({"mode": "submit_tool", "schema": schema()});
        let e = admit(&so, &["t", SUBMIT_RESULT_TOOL], "anthropic-messages", None).unwrap_err();
        assert_eq!(e.field, "structured_output");
        let so = json!({"mode": "final_text", "schema": schema()});
        let e = admit(&so, &["t"], "anthropic-messages", None).unwrap_err();
        assert_eq!(e.field, "structured_output.mode");
        let so = json!({"mode": "final_text", "schema": {"type": 12}});
        let e = admit(&so, &[], "anthropic-messages", None).unwrap_err();
        assert_eq!(e.field, "structured_output.schema");
    }

    #[test]
    fn values_are_validated_with_pointers_and_bounded_errors() {
        let so = frozen("final_text", "anthropic-messages", None);
        let r = final_text_result(&so, r#" {"answer": "yes"} "#);
        assert_eq!(
            (r.validation.as_str(), r.value),
            ("passed", Some(json!({"answer": "yes"})))
        );
        let r = final_text_result(&so, r#"{"answer": 42}"#);
        assert_eq!(r.validation, "failed");
        assert_eq!(r.value, Some(json!({"answer": 42})));
        assert!(
            r.errors.as_ref().unwrap()[0].starts_with("/answer: "),
            "{r:?}"
        );
        let r = final_text_result(&so, "not json");
        assert_eq!((r.validation.as_str(), r.value.is_none()), ("failed", true));
        r.well_formed().unwrap();
        // `format` is an annotation, never asserted.
        let fmt = json!({"mode": "final_text", "schema": {"type": "string", "format": "email"}});
        let so = admit(&fmt, &[], "gemini", None).unwrap();
        assert_eq!(
            final_text_result(&so, r#""not an email""#).validation,
            "passed"
        );
        // Many failures: at most 32 kept, flagged.
        let many =
            json!({"mode": "final_text", "schema": {"type": "array", "items": {"type": "string"}}});
        let so = admit(&many, &[], "gemini", None).unwrap();
        let r = final_text_result(&so, &serde_json::to_string(&vec![1; 40]).unwrap());
        assert_eq!(r.errors.as_ref().unwrap().len(), 32);
        assert_eq!(r.errors_truncated, Some(true));
        r.well_formed().unwrap();
    }

    #[test]
    fn submit_results_list_skipped_siblings_and_absent_has_none() {
        let so = frozen("submit_tool", "anthropic-messages", Some(true));
        let skipped = vec![SkippedSibling::new("c2", "t")];
        let r = submitted_result(&so, r#"{"answer":"x"}"#, skipped.clone());
        assert_eq!(r.skipped_siblings, Some(skipped));
        r.well_formed().unwrap();
        let r = absent_result(&so);
        assert_eq!(r.skipped_siblings, Some(Vec::new()));
        r.well_formed().unwrap();
        let rendering = rendering(&so);
        let tool = rendering.submit_tool.unwrap();
        assert_eq!(tool.name, SUBMIT_RESULT_TOOL);
        assert_eq!(
            rendering.shape.unwrap().strict_tool.as_deref(),
            Some(SUBMIT_RESULT_TOOL)
        );
    }
}

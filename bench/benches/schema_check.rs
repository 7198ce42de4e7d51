//! Checking a tool call's arguments against its tool's input schema, as a run does before
//! each dispatch (broca::protocol::schema): compiled once per schema and kept, against
//! compiled at every call (what broca did before). A weather tool's schema of the usual size,
//! arguments that match and arguments that do not.
//! Run: `cargo bench -p broca-bench --bench schema_check`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::hint::black_box;

use criterion::Criterion;
use serde_json::{json, Value};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "description": "The city to look up"},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2}
        },
        "required": ["city"],
        "additionalProperties": false
    })
}

/// What broca did before: the schema compiled at every call.
fn compile_and_check(schema: &Value, args: &Value) -> bool {
    match jsonschema::options()
        .should_validate_formats(false)
        .build(schema)
    {
        Ok(v) => v.iter_errors(args).next().is_none(),
        Err(_) => true,
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let schema = schema();
    let good = json!({"city": "Paris", "unit": "celsius", "days": 3});
    let bad = json!({"city": 12, "days": 9});
    // Both say the same of both.
    assert!(compile_and_check(&schema, &good) && !compile_and_check(&schema, &bad));
    assert!(broca::protocol::schema::validate(&schema, &good).is_ok());
    assert!(broca::protocol::schema::validate(&schema, &bad).is_err());
    let mut g = c.benchmark_group("tool arguments against their schema");
    for (name, args) in [("matching", &good), ("mismatching", &bad)] {
        g.bench_function(format!("{name}, compiled at every call"), |b| {
            b.iter(|| compile_and_check(black_box(&schema), black_box(args)))
        });
        g.bench_function(format!("{name}, compiled once (broca)"), |b| {
            b.iter(|| {
                broca::protocol::schema::validate(black_box(&schema), black_box(args)).is_ok()
            })
        });
    }
    g.finish();
    c.final_summary();
}

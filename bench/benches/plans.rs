//! A fetch plan's costs in broca, the providers' time left out (docs/plans.md): admitting a
//! session's plan (reading it, then checking four providers' answers, 40 tools and two system
//! texts, into the plan the session freezes), and what every later send of a planned session
//! adds (its config made from the frozen plan: the tools and text swapped in, the tools'
//! digest taken again). Run: `cargo bench -p broca-bench --bench plans`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use broca::core::admission::{prepare, SendRequest};
use broca::fetch_plan::plan::{apply, Arrived, Plan};
use broca::protocol::ToolSpec;
use cortexkit_role_tool_provider::catalog::{
    composition_digest, system_text_digest, CatalogAnswer, SystemTextAnswer,
};
use criterion::Criterion;
use serde_json::{json, Value};

const PROVIDERS: [&str; 4] = ["aft", "magic-context", "plexus", "prefrontal-core"];
const TOOLS_EACH: usize = 10;

fn names(provider: &str) -> Vec<String> {
    (0..TOOLS_EACH)
        .map(|i| format!("{provider}_tool_{i}"))
        .collect()
}

fn composition() -> Value {
    let providers: Vec<Value> = PROVIDERS
        .iter()
        .map(|p| json!({"provider": p, "tools": names(p), "capabilities": ["code.read/v1"]}))
        .collect();
    json!({"join_version": 1, "providers": providers})
}

fn plan() -> Value {
    let tools: Vec<Value> = PROVIDERS
        .iter()
        .map(|p| json!({"provider": p, "preset": "head", "params": {"scope": "repo"}}))
        .collect();
    json!({
        "tool_items": tools,
        "system_text_items": [{"provider": "aft", "params": {}},
                              {"provider": "prefrontal-core", "params": {}}],
        "composition": composition(),
    })
}

/// A tool with a schema of the size real tools have (five typed properties).
fn spec(provider: &str, name: &str) -> ToolSpec {
    let props: serde_json::Map<String, Value> = (0..5)
        .map(|i| {
            (
                format!("arg_{i}"),
                json!({"type": "string", "description": format!("the {i}th argument of {name}")}),
            )
        })
        .collect();
    ToolSpec {
        name: name.into(),
        description: format!("{name}: reads, edits or searches what its arguments name"),
        input_schema: json!({"type": "object", "properties": props, "required": ["arg_0"]}),
        route: format!("subc:{provider}@tp1:{name}:0123456789abcdef:1"),
        reply: None,
    }
}

fn answers() -> Vec<Arrived> {
    let digest = composition_digest(&composition()).unwrap();
    PROVIDERS
        .iter()
        .map(|p| {
            let tools = names(p);
            let mut answer = CatalogAnswer::new("g1", format!("catalog-of-{p}"))
                .with_composition_digest(digest.clone());
            if *p == "aft" || *p == "prefrontal-core" {
                let text = format!("{p}: how to use these tools well. ").repeat(40);
                let mut sorted = tools.clone();
                sorted.sort();
                answer = answer.with_system_text(
                    SystemTextAnswer::new(system_text_digest(&text), "f".repeat(64))
                        .with_text(text)
                        .with_composition_digest(digest.clone())
                        .with_tool_names(sorted),
                );
            }
            Arrived {
                answer,
                specs: tools.iter().map(|t| spec(p, t)).collect(),
            }
        })
        .collect()
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let sent = plan();
    let arrived = answers();
    c.bench_function("plan_admission_4x10", |b| {
        b.iter(|| {
            let plan = Plan::read(&sent).unwrap();
            plan.admit(arrived.iter().cloned().map(Ok).collect())
                .unwrap()
        })
    });
    let frozen = Plan::read(&sent)
        .unwrap()
        .admit(arrived.iter().cloned().map(Ok).collect())
        .unwrap();
    println!(
        "frozen plan: {} tools, {} bytes of system text, {} bytes as the WAL keeps it",
        frozen.tools.len(),
        frozen.system_text.as_ref().map_or(0, String::len),
        serde_json::to_vec(&frozen).unwrap().len()
    );
    let config = prepare(
        &SendRequest {
            prompt: "go".into(),
            model: "anthropic/claude-sonnet-4-5".into(),
            ..Default::default()
        },
        &[],
        &broca::catalog::Catalog::builtin(),
        &broca::protocol::model::AnyProvider,
    )
    .unwrap()
    .config;
    c.bench_function("planned_send_config", |b| {
        b.iter(|| {
            let mut config = config.clone();
            apply(&mut config, &frozen, false).unwrap();
            config
        })
    });
    c.bench_function("plain_send_config_clone", |b| b.iter(|| config.clone()));
    c.final_summary();
}

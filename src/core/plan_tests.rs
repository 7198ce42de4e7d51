//! A fetch plan in the domain alone (llm-runner/v1 `plans`): what a plan may carry, the
//! answers checked into the frozen plan (the tool-provider role's composition vectors), and
//! a session's later sends against what it froze.

use crate::admission::{admit_prepared, prepare, Admitted, SendRequest};
use crate::replay::Session;
use broca_fetch_plan::plan::{Arrived, Missed, Plan};
use broca_protocol::ToolSpec;
use broca_wal::planrec::FrozenPlan;
use broca_wire::Refusal;
use cortexkit_role_tool_provider::catalog::{
    composition_digest, system_text_digest, CatalogAnswer, SystemTextAnswer,
};
use serde_json::{json, Value};

fn read(plan: Value) -> Result<Plan, Refusal> {
    Plan::read(&plan)
}

fn spec(provider: &str, name: &str) -> ToolSpec {
    ToolSpec {
        name: name.into(),
        description: format!("{name} of {provider}"),
        input_schema: json!({"type": "object"}),
        route: format!("subc:{provider}@{name}-pin"),
        reply: None,
    }
}

/// `provider`'s answer offering `tools`, with `text` when given, digests as a provider
/// computes them over `composition`.
fn answer(provider: &str, tools: &[&str], text: Option<&str>, composition: &Value) -> Arrived {
    let digest = composition_digest(composition).unwrap();
    let mut answer = CatalogAnswer::new("g1", format!("catalog-of-{provider}"))
        .with_composition_digest(digest.clone());
    if let Some(text) = text {
        answer = answer.with_system_text(
            SystemTextAnswer::new(system_text_digest(text), "p".repeat(64))
                .with_text(text)
                .with_composition_digest(digest)
                .with_tool_names(tools.iter().copied()),
        );
    }
    Arrived {
        answer,
        specs: tools.iter().map(|t| spec(provider, t)).collect(),
    }
}

fn plan_of(composition: &Value) -> Value {
    json!({
        "tool_items": [{"provider": "aft", "params": {"scope": "repo"}},
                       {"provider": "magic-context", "preset": "head", "params": {}}],
        "system_text_items": [{"provider": "prefrontal-core", "params": {}},
                              {"provider": "aft", "params": {}, "optional": true}],
        "composition": composition,
    })
}

/// The role's first composition vector: two providers with tools and a text-only one.
fn vector() -> (Value, String) {
    let v: Value =
        serde_json::from_str(cortexkit_role_tool_provider::vectors::COMPOSITION_DIGEST_JSON)
            .unwrap();
    let first = &v["digests"][0];
    (
        first["composition"].clone(),
        first["composition_digest"].as_str().unwrap().to_string(),
    )
}

pub(crate) fn admitted() -> FrozenPlan {
    let (composition, _) = vector();
    let plan = read(plan_of(&composition)).unwrap();
    plan.admit(vec![
        Ok(answer(
            "aft",
            &["read", "edit", "bash"],
            Some("aft text"),
            &composition,
        )),
        Ok(answer("magic-context", &["ctx_search"], None, &composition)),
        Ok(answer(
            "prefrontal-core",
            &[],
            Some("core text"),
            &composition,
        )),
    ])
    .unwrap()
}

#[test]
fn a_plan_is_read_as_one_fetch_per_provider_with_its_items_requests() {
    let (composition, _) = vector();
    let plan = read(plan_of(&composition)).unwrap();
    let providers: Vec<&str> = plan.fetches().iter().map(|f| f.provider.as_str()).collect();
    assert_eq!(providers, ["aft", "magic-context", "prefrontal-core"]);
    let aft = serde_json::to_value(plan.request(&plan.fetches()[0])).unwrap();
    assert_eq!(aft["params"], json!({"scope": "repo"}));
    assert_eq!(aft["composition"], composition);
    assert_eq!(aft["system_text"], json!({"params": {}}));
    let mc = serde_json::to_value(plan.request(&plan.fetches()[1])).unwrap();
    assert_eq!(mc["preset"], "head");
    assert!(mc.get("system_text").is_none());
}

#[test]
fn a_plans_identity_is_its_jcs_digest_and_its_composition_digest_is_the_roles() {
    let (composition, digest) = vector();
    let a = read(plan_of(&composition)).unwrap();
    assert_eq!(
        a.identity,
        composition_digest(&plan_of(&composition)).unwrap()
    );
    let other = read(json!({"composition": {"join_version": 1}})).unwrap();
    assert_ne!(a.identity, other.identity);
    assert_eq!(
        admitted().composition_digest.as_deref(),
        Some(digest.as_str())
    );
}

#[test]
fn admission_freezes_tools_in_plan_order_and_joins_the_texts_that_arrived() {
    let frozen = admitted();
    let names: Vec<&str> = frozen.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["read", "edit", "bash", "ctx_search"]);
    assert_eq!(frozen.system_text.as_deref(), Some("aft text\n\ncore text"));
    let items: Vec<(&str, Option<&str>)> = frozen
        .items
        .iter()
        .map(|i| (i.provider.as_str(), i.item.as_deref()))
        .collect();
    assert_eq!(
        items,
        [
            ("aft", Some("tools")),
            ("aft", Some("system_text")),
            ("magic-context", None),
            ("prefrontal-core", None)
        ]
    );
    assert_eq!(frozen.items[1].item_digest, system_text_digest("aft text"));
    let baseline =
        broca_fetch_plan::plan::baseline(&frozen, names.iter().map(|n| n.to_string()).collect());
    assert_eq!(baseline["state"], "ready");
    assert_eq!(
        baseline["baseline"]["composition_digest"],
        json!(vector().1)
    );
    assert_eq!(baseline["baseline"]["items"].as_array().unwrap().len(), 4);
}

#[test]
fn a_required_item_missing_is_fetch_unavailable_and_an_optional_one_is_recorded_absent() {
    let composition = json!({"join_version": 1});
    let plan = read(json!({
        "tool_items": [{"provider": "a", "params": {}}],
        "system_text_items": [{"provider": "b", "params": {}, "optional": true}],
        "composition": composition,
    }))
    .unwrap();
    let refused = Missed::Refused {
        code: "invalid_request".into(),
        message: "no".into(),
    };
    let frozen = plan
        .admit(vec![
            Ok(answer("a", &["t"], None, &composition)),
            Err(refused),
        ])
        .unwrap();
    assert_eq!(frozen.absent_items.len(), 1);
    assert_eq!(frozen.absent_items[0].reason, "refused");
    assert_eq!(
        frozen.absent_items[0].provider_code.as_deref(),
        Some("invalid_request")
    );
    assert_eq!(frozen.system_text, None);
    let baseline = broca_fetch_plan::plan::baseline(&frozen, vec!["t".into()]);
    assert_eq!(baseline["baseline"]["absent_items"][0]["provider"], "b");
    let e = plan
        .admit(vec![
            Err(Missed::Timeout),
            Ok(answer("b", &[], Some("x"), &composition)),
        ])
        .unwrap_err();
    assert!(matches!(&e, Refusal::FetchUnavailable { provider, .. } if provider == "a"));
    assert_eq!(
        e.code().class(),
        broca_protocol::ErrorClass::Transient,
        "{e}"
    );
}

#[test]
fn answers_that_disagree_with_the_plan_are_plan_stale_naming_each_difference() {
    let (composition, _) = vector();
    let plan = read(plan_of(&composition)).unwrap();
    let mut wrong_text = answer("prefrontal-core", &[], Some("core text"), &composition);
    if let Some(t) = wrong_text.answer.system_text.as_mut() {
        t.text = Some("changed".into());
    }
    // `bash` gone: the composition lists it, and the text was written for it.
    let mut aft = answer("aft", &["read", "edit"], Some("aft text"), &composition);
    if let Some(t) = aft.answer.system_text.as_mut() {
        t.tool_names = Some(vec!["bash".into(), "edit".into(), "read".into()]);
    }
    let e = plan
        .admit(vec![
            Ok(aft),
            // Answered over another composition.
            Ok(answer(
                "magic-context",
                &["ctx_search"],
                None,
                &json!({"other": 1}),
            )),
            Ok(wrong_text),
        ])
        .unwrap_err();
    let Refusal::PlanStale { differences } = &e else {
        panic!("{e:?}");
    };
    let kinds: Vec<&str> = differences
        .iter()
        .map(|d| d["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        [
            "tools",
            "text_tool_names",
            "composition",
            "system_text_digest"
        ]
    );
    assert_eq!(differences[0]["missing"], json!(["bash"]));
}

#[test]
fn two_providers_offering_one_name_collide_naming_both() {
    let composition = json!({});
    let plan = read(json!({"tool_items": [{"provider": "a", "params": {}},
                                          {"provider": "b", "params": {}}]}))
    .unwrap();
    let e = plan
        .admit(vec![
            Ok(answer("a", &["read"], None, &composition)),
            Ok(answer("b", &["read"], None, &composition)),
        ])
        .unwrap_err();
    assert_eq!(
        e,
        Refusal::PlanToolCollision {
            name: "read".into(),
            providers: vec!["a".into(), "b".into()]
        }
    );
    assert_eq!(
        broca_wire::RpcError::refusal(&e).detail_body()["providers"],
        json!(["a", "b"])
    );
}

#[test]
fn members_broca_does_not_serve_are_refused_by_name_before_any_fetch() {
    // The refusal is dropped with the closure's call; the field's name outlives it.
    let field = |plan: Value| {
        let refused = read(plan).unwrap_err();
        refused
            .field()
            .map(|f| &*Box::leak(f.to_string().into_boxed_str()))
    };
    assert_eq!(
        field(json!({"compaction_item": {"provider": "c", "params": {}}})),
        Some("plan.compaction_item.preset")
    );
    assert_eq!(
        field(json!({"tool_items": [{"provider": "a", "params": {}, "upfront": ["x"]}]})),
        Some("plan.tool_items[].upfront")
    );
    assert_eq!(
        field(json!({"tool_items": [{"provider": "a", "output_refs": true}]})),
        Some("plan.tool_items[].output_refs")
    );
    // Senders are read and checked: each module once, every slot placed.
    assert_eq!(
        field(json!({"senders": [{"module": "m"}, {"module": "m"}]})),
        Some("plan.senders")
    );
    let unplaced =
        json!({"id": "t", "text": "no slot here", "slots": {"n": {"type": "percentage"}}});
    assert_eq!(
        field(json!({"senders": [{"module": "m", "templates": [unplaced]}]})),
        Some("plan.senders")
    );
    for plan in [
        json!([]),
        json!({"readers": []}),
        json!({"tool_items": [{"provider": ""}]}),
        json!({"tool_items": [{"provider": "a"}, {"provider": "a"}]}),
        json!({"composition": {"join_version": 2}}),
        json!({"what": 1}),
    ] {
        assert_eq!(field(plan.clone()), Some("plan"), "{plan}");
    }
}

pub(crate) fn send(plan: Option<Value>, tools: Option<Vec<String>>) -> crate::admission::Prepared {
    prepare(
        &SendRequest {
            prompt: "go".into(),
            model: "anthropic/m".into(),
            system: Some("own".into()),
            tools,
            plan,
            ..Default::default()
        },
        &[spec("configured", "configured_tool")],
        &broca_catalog::Catalog::builtin(),
        &broca_protocol::model::AnyProvider,
    )
    .unwrap()
}

fn admit(
    p: crate::admission::Prepared,
    s: &Session,
) -> Result<Box<broca_wal::runrec::RunStarted>, Refusal> {
    match admit_prepared(p, s, "r".into(), 1)? {
        Admitted::New(r) => Ok(r),
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_first_send_freezes_the_plan_and_later_sends_run_on_it_or_drift() {
    let (composition, _) = vector();
    let plan = plan_of(&composition);
    let mut first = send(Some(plan.clone()), None);
    first.plan.as_mut().unwrap().admitted = Some(Box::new(admitted()));
    let started = admit(first, &Session::default()).unwrap();
    let names: Vec<&str> = started
        .config
        .tools
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["read", "edit", "bash", "ctx_search"],
        "the plan's, not the configured"
    );
    assert_eq!(
        started.config.system.as_deref(),
        Some("aft text\n\ncore text\n\nown")
    );
    assert!(started.config.plan.is_some());
    // As the WAL keeps it: the plan's tools written once, as the config's, and read back.
    let record = broca_wal::Record::RunStarted(started.clone());
    let mut payload = Vec::new();
    record.encode_payload(&mut payload);
    let text = String::from_utf8(payload.clone()).unwrap();
    assert_eq!(
        text.matches("edit of aft").count(),
        1,
        "each tool once in the record"
    );
    let decoded = broca_wal::Record::decode(record.kind(), &payload).unwrap();
    let mut s = Session::default();
    s.apply(1, decoded).unwrap();
    s.apply(2, crate::retention_tests::finished("r", 2))
        .unwrap();
    assert_eq!(
        s.plan.as_deref().map(|p| (&p.identity, &p.tools)),
        started
            .config
            .plan
            .as_deref()
            .map(|p| (&p.identity, &p.tools))
    );
    // A later send, with the plan repeated or left out, runs on the frozen plan.
    for later in [Some(plan.clone()), None] {
        let run = admit(send(later, None), &s).unwrap();
        assert_eq!(run.config.tools, started.config.tools);
        assert_eq!(run.config.tools_digest, started.config.tools_digest);
        assert!(
            run.config.plan.is_none(),
            "frozen once, on the run that admitted it"
        );
    }
    // Another plan is refused, naming both.
    let mut other = plan.clone();
    other["composition"] = json!({"join_version": 1});
    let e = admit(send(Some(other.clone()), None), &s).unwrap_err();
    let detail = broca_wire::RpcError::refusal(&e).detail_body();
    assert_eq!(e.code().as_str(), "plan_drift");
    assert_eq!(detail["sent"], json!(read(other).unwrap().identity));
    assert_eq!(detail["frozen"], json!(read(plan).unwrap().identity));
    // A planned session's tools are its plan's.
    assert_eq!(
        admit(send(None, Some(vec!["configured_tool".into()])), &s)
            .unwrap_err()
            .field(),
        Some("tools")
    );
}

#[test]
fn a_plan_sent_to_a_session_begun_without_one_drifts_with_nothing_frozen() {
    let mut s = Session::default();
    let plain = admit(send(None, None), &s).unwrap();
    s.apply(1, broca_wal::Record::RunStarted(plain)).unwrap();
    s.apply(2, crate::retention_tests::finished("r", 2))
        .unwrap();
    let mut late = send(Some(json!({})), None);
    late.plan.as_mut().unwrap().admitted =
        Some(Box::new(read(json!({})).unwrap().admit(vec![]).unwrap()));
    let e = admit(late, &s).unwrap_err();
    let detail = broca_wire::RpcError::refusal(&e).detail_body();
    assert_eq!(e.code().as_str(), "plan_drift");
    assert!(detail.get("frozen").is_none(), "{detail}");
    assert_eq!(detail["sent"], json!(read(json!({})).unwrap().identity));
}

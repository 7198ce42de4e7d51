//! Admission's tests (a child of `admission`).
use super::*;
use broca_protocol::model::AnyProvider;

fn req(prompt: &str, tools: Option<Vec<String>>) -> SendRequest {
    SendRequest {
        prompt: prompt.into(),
        model: "anthropic/m".into(),
        send_id: Some("k1".into()),
        tools,
        ..SendRequest::default()
    }
}

#[test]
fn a_send_id_admitted_before_answers_its_run_even_if_its_inputs_no_longer_pass() {
    let catalog = catalog::Catalog::builtin();
    let tool = ToolSpec {
        name: "t".into(),
        description: String::new(),
        input_schema: serde_json::json!({}),
        route: String::new(),
        reply: None,
    };
    let first = req("hi", Some(vec!["t".into()]));
    let p = prepare(&first, std::slice::from_ref(&tool), &catalog, &AnyProvider).unwrap();
    let Admitted::New(started) = admit_prepared(p, &Session::default(), "r1".into(), 1).unwrap()
    else {
        panic!()
    };
    let mut session = Session::default();
    session
        .apply(1, broca_wal::Record::RunStarted(started))
        .unwrap();
    // The tool is no longer configured: the same send is refused on its own ...
    let u = prepare(&first, &[], &catalog, &AnyProvider).unwrap_err();
    assert_eq!(u.refusal.code().as_str(), "invalid_params");
    // ... and still answers the run its send_id started.
    assert_eq!(
        admit_unprepared(&u, &session),
        Ok(Admitted::Existing { run_index: 0 })
    );
    // Other inputs under that send_id: refused as a reuse.
    let other = prepare(
        &req("other", Some(vec!["t".into()])),
        &[],
        &catalog,
        &AnyProvider,
    )
    .unwrap_err();
    assert_eq!(
        admit_unprepared(&other, &session)
            .unwrap_err()
            .code()
            .as_str(),
        "send_id_reuse"
    );
    // A session that never saw the send_id: the refusal itself.
    assert_eq!(
        admit_unprepared(&u, &Session::default())
            .unwrap_err()
            .code()
            .as_str(),
        "invalid_params"
    );
}

#[test]
fn a_send_id_reused_with_another_structured_output_is_refused_naming_it() {
    let catalog = catalog::Catalog::builtin();
    let shaped = |schema: serde_json::Value| {
        let mut r = req("same prompt", Some(Vec::new()));
        r.structured_output = Some(serde_json::json!({"mode": "final_text", "schema": schema}));
        r
    };
    let first = shaped(serde_json::json!({"type": "object"}));
    let p = prepare(&first, &[], &catalog, &AnyProvider).unwrap();
    assert_eq!(
        p.config
            .structured_output
            .as_ref()
            .map(|so| so.reason.clone()),
        Some(Some("catalog_unknown".into())),
        "the built-in catalog does not say whether the model takes schemas"
    );
    let Admitted::New(started) = admit_prepared(p, &Session::default(), "r1".into(), 1).unwrap()
    else {
        panic!()
    };
    let mut session = Session::default();
    session
        .apply(1, broca_wal::Record::RunStarted(started))
        .unwrap();
    let again = prepare(&first, &[], &catalog, &AnyProvider).unwrap();
    assert_eq!(
        admit_prepared(again, &session, "r2".into(), 2),
        Ok(Admitted::Existing { run_index: 0 })
    );
    for other in [
        shaped(serde_json::json!({"type": "array"})),
        req("same prompt", Some(Vec::new())),
    ] {
        let p = prepare(&other, &[], &catalog, &AnyProvider).unwrap();
        let refusal = admit_prepared(p, &session, "r3".into(), 3).unwrap_err();
        assert_eq!(
            (refusal.code().as_str(), refusal.field()),
            ("send_id_reuse", Some("structured_output"))
        );
    }
}

#[test]
fn sends_behind_an_active_run_queue_in_order_up_to_the_bound() {
    let catalog = catalog::Catalog::builtin();
    let send = |prompt: &str, send_id: &str| {
        let mut r = req(prompt, None);
        r.send_id = Some(send_id.into());
        prepare(&r, &[], &catalog, &AnyProvider).unwrap()
    };
    let mut session = Session::default();
    let Admitted::New(started) =
        admit_prepared(send("first", "k0"), &session, "r0".into(), 1).unwrap()
    else {
        panic!("an idle session starts the run")
    };
    session
        .apply(1, broca_wal::Record::RunStarted(started))
        .unwrap();
    for i in 0..QUEUED_SENDS_MAX {
        let admitted = admit_prepared(
            send("next", &format!("q{i}")),
            &session,
            format!("r{}", i + 1),
            2,
        );
        let Ok(Admitted::Queued(q)) = admitted else {
            panic!("send {i} behind the run is queued: {admitted:?}")
        };
        session
            .apply(2 + i as u64, broca_wal::Record::SendQueued(q))
            .unwrap();
    }
    // The same send again answers its submission; one more is refused, nothing queued.
    assert!(matches!(
        admit_prepared(send("next", "q0"), &session, "rx".into(), 3),
        Ok(Admitted::Pending { .. })
    ));
    let refused = admit_prepared(send("one more", "q-extra"), &session, "ry".into(), 3);
    assert_eq!(refused.unwrap_err().code().as_str(), "session_busy");
    // Once the run ends, the first queued send is the next run, naming its submission.
    let q0 = session.queued[0].submission_id.clone();
    let mut s2 = session.clone();
    s2.open = None;
    s2.runs[0].state = RunState::Finished(broca_wal::runrec::FinishKind::Completed);
    let next = start_queued(&s2, "rn".into(), 4).unwrap();
    assert_eq!(
        (next.submission_id.as_deref(), next.send_id.as_deref()),
        (Some(q0.as_str()), Some("q0"))
    );
    assert!(
        start_queued(&session, "rn".into(), 4).is_none(),
        "not while the run is active"
    );
}

#[test]
fn the_session_input_cap_only_goes_down_and_carries_what_was_spent() {
    let catalog = catalog::Catalog::builtin();
    let send = |send_id: &str, cap: Option<u64>| {
        let mut r = req("go", None);
        r.send_id = Some(send_id.into());
        r.max_input_tokens = cap;
        prepare(&r, &[], &catalog, &AnyProvider).unwrap()
    };
    let cap_of = |a: Result<Admitted, Refusal>| match a {
        Ok(Admitted::New(r)) => r.config.stop.input_cap,
        other => panic!("not a new run: {other:?}"),
    };
    let mut session = Session::default();
    // No cap yet: none is kept, and the session's usage counts all the same.
    assert_eq!(
        cap_of(admit_prepared(send("a", None), &session, "r0".into(), 1)),
        None
    );
    let Ok(Admitted::New(first)) = admit_prepared(send("b", Some(10)), &session, "r1".into(), 1)
    else {
        panic!()
    };
    session
        .apply(1, broca_wal::Record::RunStarted(first))
        .unwrap();
    session.open = None;
    session.runs[0].state = RunState::Finished(broca_wal::runrec::FinishKind::Completed);
    session.input.spent = 7;
    let raise = admit_prepared(send("c", Some(11)), &session, "r2".into(), 2).unwrap_err();
    assert_eq!(
        raise,
        Refusal::InvalidField {
            field: "budget.max_input_tokens",
            why: "the session's input cap is 10 tokens and only goes down; 11 would raise it"
                .into()
        }
    );
    let kept = InputCap {
        limit: 10,
        spent: 7,
        unmeasured: false,
    };
    // Omitted or repeated: the frozen cap, with what the session spent; lowered: lower.
    assert_eq!(
        cap_of(admit_prepared(send("d", None), &session, "r3".into(), 2)),
        Some(kept)
    );
    assert_eq!(
        cap_of(admit_prepared(
            send("e", Some(10)),
            &session,
            "r4".into(),
            2
        )),
        Some(kept)
    );
    assert_eq!(
        cap_of(admit_prepared(send("f", Some(4)), &session, "r5".into(), 2)),
        Some(InputCap { limit: 4, ..kept })
    );
}

#[test]
fn an_ordered_send_that_ended_answers_its_state_and_its_identity_leaves_out_its_expiry() {
    use broca_protocol::delivery::SendOrder;
    use broca_wal::runrec::{SendEnded, SendRetracted};
    use cortexkit_role_llm_runner::delivery_order::Mode;
    let catalog = catalog::Catalog::builtin();
    let mut session = Session::default();
    let p = prepare(&req("busy", Some(Vec::new())), &[], &catalog, &AnyProvider).unwrap();
    let Admitted::New(started) = admit_prepared(p, &session, "r1".into(), 1).unwrap() else {
        panic!()
    };
    session
        .apply(1, broca_wal::Record::RunStarted(started))
        .unwrap();
    let ordered = |modes: Vec<Mode>, expires: u64| {
        let mut r = req("reminder", None);
        r.send_id = Some("o1".into());
        r.order = Some(SendOrder {
            modes,
            dedupe_key: Some("k".into()),
            expires_at_ms: Some(expires),
            template: None,
        });
        r
    };
    let p = prepare(
        &ordered(vec![Mode::IdleStart], 10),
        &[],
        &catalog,
        &AnyProvider,
    )
    .unwrap();
    let Admitted::Queued(queued) = admit_prepared(p, &session, "r2".into(), 2).unwrap() else {
        panic!("a send behind the open run waits")
    };
    assert_eq!(
        queued.order.as_ref().map(|o| o.modes.clone()),
        Some(vec![Mode::IdleStart])
    );
    let submission = queued.submission_id.clone();
    session
        .apply(2, broca_wal::Record::SendQueued(queued))
        .unwrap();
    let ended = SendEnded::Superseded { by: "sub_x".into() };
    let record = SendRetracted {
        submission_id: submission,
        at_unix_ms: 3,
        ended: Some(ended.clone()),
    };
    session
        .apply(3, broca_wal::Record::SendRetracted(record))
        .unwrap();
    assert!(session.queued.is_empty(), "an ended send waits no more");
    let again = |r: &SendRequest| {
        let p = prepare(r, &[], &catalog, &AnyProvider).unwrap();
        admit_prepared(p, &session, "r3".into(), 4)
    };
    // The same send, even with another deadline, answers its terminal state.
    assert_eq!(
        again(&ordered(vec![Mode::IdleStart], 10)),
        Ok(Admitted::Ended(ended.clone()))
    );
    assert_eq!(
        again(&ordered(vec![Mode::IdleStart], 99)),
        Ok(Admitted::Ended(ended.clone()))
    );
    // Another list under the same send_id is a reuse naming `delivery`.
    match again(&ordered(vec![Mode::Steer, Mode::IdleStart], 10)) {
        Err(Refusal::SendIdReuse { field, .. }) => assert_eq!(field, Some("delivery")),
        other => panic!("{other:?}"),
    }
}

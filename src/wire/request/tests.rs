//! The request parser's own checks.

use super::*;

#[test]
fn each_method_parses_its_params_strictly() {
    let triple = r#""project_root":"/p","harness":"h","session":"s""#;
    let ok = |body: String| parse(body.as_bytes()).unwrap();
    let r = ok(format!(
        r#"{{"method":"session.read","params":{{{triple},"limit":5}}}}"#
    ));
    assert_eq!(
        r,
        Request::Read {
            session: SessionName {
                project_root: "/p".into(),
                harness: "h".into(),
                session: "s".into()
            },
            read: Box::new(ReadRequest::tail().with_limit(5)),
        }
    );
    assert_eq!(
        ok(format!(
            r#"{{"method":"run.status","params":{{{triple}}}}}"#
        ))
        .method(),
        Method::RunStatus
    );
    for (body, code) in [
        (
            format!(r#"{{"method":"run.result","params":{{{triple}}}}}"#),
            "invalid_params",
        ),
        (
            format!(r#"{{"method":"run.status","params":{{{triple},"x":1}}}}"#),
            "invalid_params",
        ),
        (
            format!(r#"{{"method":"nope","params":{{{triple}}}}}"#),
            "unknown_method",
        ),
        (r#"{"method":"run.status"}"#.to_string(), "invalid_params"),
        ("[]".to_string(), "invalid_request"),
        (
            format!(r#"{{"method":"session.read","params":{{{triple},"from_ordnal":1}}}}"#),
            "invalid_params",
        ),
        (
            format!(
                r#"{{"method":"session.send","params":{{{triple},"prompt":"p","model":"a/m","delivery":"broadcast"}}}}"#
            ),
            "invalid_params",
        ),
        // Only a steer or an interrupt may leave out the model.
        (
            format!(r#"{{"method":"session.send","params":{{{triple},"prompt":"p"}}}}"#),
            "invalid_params",
        ),
    ] {
        assert_eq!(
            parse(body.as_bytes()).unwrap_err().code.as_str(),
            code,
            "{body}"
        );
    }
    // A refusal names the field at fault: an unknown one, or one of the wrong type.
    let field = |body: String| parse(body.as_bytes()).unwrap_err().detail["field"].clone();
    assert_eq!(
        field(format!(
            r#"{{"method":"session.send","params":{{{triple},"prompt":"p","delivery":"later"}}}}"#
        )),
        "delivery"
    );
    assert_eq!(
        field(format!(
            r#"{{"method":"session.send","params":{{{triple},"prompt":"p","model":"a/m","route_decision_id":7}}}}"#
        )),
        "route_decision_id"
    );
    // A steer and an interrupt parse without a model, and keep their mode.
    for mode in ["steer", "interrupt"] {
        let body = format!(
            r#"{{"method":"session.send","params":{{{triple},"prompt":"p","delivery":"{mode}"}}}}"#
        );
        match parse(body.as_bytes()).unwrap() {
            Request::Send { send, .. } => {
                assert_eq!(
                    (send.model.as_str(), send.delivery.as_deref()),
                    ("", Some(mode))
                )
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        field(format!(
            r#"{{"method":"session.read","params":{{{triple},"from_ordnal":1}}}}"#
        )),
        "from_ordnal"
    );
    assert_eq!(
        field(format!(
            r#"{{"method":"session.read","params":{{{triple},"limit":"x"}}}}"#
        )),
        "limit"
    );
    assert_eq!(
        field(format!(
            r#"{{"method":"session.send","params":{{{triple},"prompt":"p","model":"a/m","delivery":["queue"]}}}}"#
        )),
        "delivery"
    );
    for m in Method::ALL {
        assert_eq!(Method::parse(m.as_str()), Some(m));
    }
}

#[test]
fn the_lists_parse_strictly_and_sessions_list_is_not_served_on_a_route() {
    let Ok(Request::SessionsList { list }) = parse(
        br#"{"method":"sessions.list","params":{"project_root":"/p","state":"active","limit":2}}"#,
    ) else {
        panic!()
    };
    assert_eq!(
        (
            list.project_root.as_deref(),
            list.state.as_deref(),
            list.limit
        ),
        (Some("/p"), Some("active"), 2)
    );
    let route = SessionName {
        project_root: "/p".into(),
        harness: "h".into(),
        session: "s".into(),
    };
    let e = parse_on_route(br#"{"method":"sessions.list","params":{}}"#, &route).unwrap_err();
    assert_eq!(e.detail["field"], "session", "{e:?}");
    let Ok(Request::RunsList { session, list }) =
        parse_on_route(br#"{"method":"runs.list","params":{"limit":3}}"#, &route)
    else {
        panic!()
    };
    assert_eq!((session, list.limit), (route, 3));
    let e = parse(br#"{"method":"sessions.list","params":{"cursor":"nope"}}"#).unwrap_err();
    assert_eq!(e.detail["field"], "cursor");
    let e = parse(br#"{"method":"runs.list","params":{"project_root":"/p","harness":"h","session":"s","limit":0}}"#).unwrap_err();
    assert_eq!(e.detail["field"], "limit");
}

#[test]
fn a_send_budget_is_the_role_closed_object_and_run_budgets_are_stop_conditions() {
    let send = |extra: &str| {
        let body = format!(
            r#"{{"method":"session.send","params":{{"project_root":"/p","harness":"h","session":"s","prompt":"p","model":"a/m",{extra}}}}}"#
        );
        parse(body.as_bytes())
    };
    let Ok(Request::Send { send: taken, .. }) =
        send(r#""budget":{"max_input_tokens":6},"stop_when":{"max_steps":3,"max_total_tokens":9}"#)
    else {
        panic!()
    };
    assert_eq!(taken.max_input_tokens, Some(6));
    assert_eq!(taken.max_steps, Some(3));
    assert_eq!(taken.budget.and_then(|b| b.max_total_tokens), Some(9));
    for (extra, field) in [
        (r#""budget":[]"#, "budget"),
        (
            r#""budget":{"max_input_tokens":0}"#,
            "budget.max_input_tokens",
        ),
        (
            r#""budget":{"max_input_tokens":-1}"#,
            "budget.max_input_tokens",
        ),
        (
            r#""budget":{"max_input_tokens":1.5}"#,
            "budget.max_input_tokens",
        ),
        (
            r#""budget":{"max_input_tokens":null}"#,
            "budget.max_input_tokens",
        ),
        (
            r#""budget":{"max_input_tokens":18446744073709551616}"#,
            "budget.max_input_tokens",
        ),
        (r#""budget":{"foo":1}"#, "budget.foo"),
        (
            r#""budget":{"nudges":[{"at_tool_calls":1,"text":"hint","foo":1}]}"#,
            "budget.nudges[0].foo",
        ),
        (r#""budget":{"finalize_text":"x"}"#, "budget.finalize_text"),
        (
            r#""budget":{"max_total_tokens":5}"#,
            "budget.max_total_tokens",
        ),
        (r#""max_input_tokens":5"#, "max_input_tokens"),
        (
            r#""stop_when":{"max_cost_micros":0}"#,
            "stop_when.max_cost_micros",
        ),
    ] {
        let e = send(extra).unwrap_err();
        assert_eq!(
            (e.code.as_str(), e.detail["field"].as_str()),
            ("invalid_params", Some(field)),
            "{extra}"
        );
    }
}

#[test]
fn a_delivery_list_parses_with_its_members_and_each_refusal_names_its_member() {
    use broca_protocol::delivery::SendOrder;
    use cortexkit_role_llm_runner::delivery_order::Mode;
    let triple = r#""project_root":"/p","harness":"h","session":"s""#;
    let send =
        |members: &str| format!(r#"{{"method":"session.send","params":{{{triple},{members}}}}}"#);
    let order = |members: &str| match parse(send(members).as_bytes()) {
        Ok(Request::Send { send, .. }) => (send.order.clone(), send.prompt.clone()),
        other => panic!("{members}: {other:?}"),
    };
    // A list may leave out `model` (it may join the running run), and carries its members.
    let (got, prompt) = order(
        r#""prompt":"p","delivery":["steer","idle_start"],"dedupe_key":"k","expires_at_ms":5"#,
    );
    assert_eq!(
        got,
        Some(SendOrder {
            modes: vec![Mode::Steer, Mode::IdleStart],
            dedupe_key: Some("k".into()),
            expires_at_ms: Some(5),
            template: None,
        })
    );
    assert_eq!(prompt, "p");
    // A template send has no prompt: its text is the template's rendering.
    let (got, prompt) = order(
        r#""delivery":["turn_system","steer"],"template":{"id":"t","digest":"d","slots":{"pct":5}}"#,
    );
    let template = got.unwrap().template.unwrap();
    assert_eq!(
        (template.id.as_str(), template.slots["pct"].as_u64()),
        ("t", Some(5))
    );
    assert_eq!(prompt, "");
    // A string delivery stays broca's own, with no order.
    assert_eq!(
        order(r#""prompt":"p","model":"a/m","delivery":"steer""#).0,
        None
    );

    let field =
        |members: &str| parse(send(members).as_bytes()).unwrap_err().detail["field"].clone();
    for (members, named) in [
        (r#""prompt":"p","delivery":[]"#, "delivery"),
        (r#""prompt":"p","delivery":["steer","steer"]"#, "delivery"),
        (r#""prompt":"p","delivery":["queue"]"#, "delivery"),
        (
            r#""prompt":"p","delivery":"steer","dedupe_key":"k""#,
            "dedupe_key",
        ),
        (
            r#""prompt":"p","model":"a/m","expires_at_ms":5"#,
            "expires_at_ms",
        ),
        (
            r#""prompt":"p","delivery":["steer"],"dedupe_key":"""#,
            "dedupe_key",
        ),
        (
            r#""prompt":"p","delivery":["steer"],"expires_at_ms":-1"#,
            "expires_at_ms",
        ),
        (r#""delivery":["steer"]"#, "template"),
        (r#""prompt":"","delivery":["steer"]"#, "template"),
        (
            r#""prompt":"p","delivery":["steer"],"template":{"id":"t","digest":"d"}"#,
            "template",
        ),
        (
            r#""delivery":["steer"],"template":{"id":"t","digest":"d","extra":1}"#,
            "template",
        ),
    ] {
        assert_eq!(field(members), named, "{members}");
    }
}

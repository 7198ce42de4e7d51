//! Whole-session retention (llm-runner/v1 `retention`) in the domain alone: a send's bounds,
//! the session's lower-only policy, and when a session expires (never while a run is not
//! over; its last activity plus its retention after).

use crate::admission::{prepare, session_retention, SendRequest};
use crate::replay::{Expiry, Session};
use broca_wal::Record;
use broca_wire::Refusal;

/// `req` prepared against the built-in catalog, with no tools.
fn prepared_req(req: &SendRequest) -> Result<crate::admission::Prepared, Refusal> {
    prepare(
        req,
        &[],
        &broca_catalog::Catalog::builtin(),
        &broca_protocol::model::AnyProvider,
    )
    .map_err(|u| u.refusal)
}

fn send(retention: Option<u64>) -> Result<broca_wal::runrec::FrozenConfig, Refusal> {
    prepared_req(&SendRequest {
        prompt: "go".into(),
        model: "anthropic/m".into(),
        retention,
        ..Default::default()
    })
    .map(|p| p.config)
}

fn started(run_id: &str, retention: Option<u64>, at: u64) -> Record {
    crate::replay::tests::started_with(run_id, send(retention).unwrap(), at)
}

pub(crate) use crate::support_tests::finished;

#[test]
fn a_retention_of_zero_or_above_the_maximum_is_refused_by_name() {
    let zero = send(Some(0)).unwrap_err();
    assert_eq!(zero.field(), Some("retention"));
    let max = broca_wire::role::RETENTION_MAX_SECONDS;
    let above = send(Some(max + 1)).unwrap_err();
    assert_eq!(
        above,
        Refusal::RetentionAboveMax {
            asked: max + 1,
            max_seconds: max
        }
    );
    let e = broca_wire::RpcError::refusal(&above);
    assert_eq!(e.detail["field"], "retention");
    assert_eq!(e.detail["max_seconds"], max);
    assert_eq!(send(Some(max)).unwrap().retention, Some(max));
    assert_eq!(send(None).unwrap().retention, None);
}

#[test]
fn the_first_send_freezes_it_and_later_ones_only_shorten_it() {
    let fresh = Session::default();
    assert_eq!(session_retention(&fresh, Some(60)), Ok(Some(60)));
    assert_eq!(session_retention(&fresh, None), Ok(None));

    let kept = Session::replay([(1, started("r1", Some(60), 1_000))].into_iter()).unwrap();
    assert_eq!(kept.retention, Some(60));
    // Absent: unchanged, never reset to forever; equal or shorter: taken; longer: refused.
    assert_eq!(session_retention(&kept, None), Ok(Some(60)));
    assert_eq!(session_retention(&kept, Some(60)), Ok(Some(60)));
    assert_eq!(session_retention(&kept, Some(30)), Ok(Some(30)));
    let longer = session_retention(&kept, Some(61)).unwrap_err();
    assert_eq!(longer.field(), Some("retention"));

    // First sent without one: kept forever, and no later send gives it one.
    let forever = Session::replay([(1, started("r1", None, 1_000))].into_iter()).unwrap();
    assert_eq!(forever.retention, None);
    let late = session_retention(&forever, Some(60)).unwrap_err();
    assert_eq!(late.field(), Some("retention"));
}

#[test]
fn a_session_expires_at_its_last_activity_plus_its_retention_never_while_a_run_is_open() {
    let mut s = Session::default();
    assert_eq!(s.expiry(), Expiry::Never);
    s.apply(1, started("r1", Some(60), 1_000)).unwrap();
    assert_eq!(s.expiry(), Expiry::Held, "a run not over holds it");
    s.apply(2, finished("r1", 5_000)).unwrap();
    assert_eq!(s.activity_ms, Some(5_000));
    assert_eq!(s.expiry(), Expiry::At(65_000));
    // A later, shorter send: the clock restarts from its run's end, at the shorter value.
    s.apply(3, started("r2", Some(10), 70_000)).unwrap();
    assert_eq!(s.expiry(), Expiry::Held);
    s.apply(4, finished("r2", 71_000)).unwrap();
    assert_eq!(s.retention, Some(10));
    assert_eq!(s.expiry(), Expiry::At(81_000));
}

#[test]
fn a_steer_that_shortens_the_retention_is_kept_with_it() {
    use broca_wal::runrec::SendSteered;
    let mut s = Session::default();
    s.apply(1, started("r1", Some(60), 1_000)).unwrap();
    let steer = |retention| {
        Record::SendSteered(Box::new(SendSteered {
            run_id: "r1".into(),
            send_id: None,
            inputs_digest: "d".into(),
            prompt: "and then".into(),
            at_unix_ms: 2_000,
            principal: None,
            scope_owner: None,
            client_message_id: None,
            media: Vec::new(),
            order: None,
            submission_id: None,
            retention,
            retention_policy: None,
            pre_user: Vec::new(),
        }))
    };
    s.apply(2, steer(None)).unwrap();
    assert_eq!(s.retention, Some(60), "a steer naming none leaves it");
    s.apply(3, steer(Some(20))).unwrap();
    assert_eq!(s.retention, Some(20));
    assert_eq!(
        session_retention(&s, Some(30)).unwrap_err().field(),
        Some("retention")
    );
}

/// A send naming `keep` as its storage policy, prepared.
fn prepared(keep: serde_json::Value) -> crate::admission::Prepared {
    let req = SendRequest {
        prompt: "go".into(),
        model: "anthropic/m".into(),
        retention_policy: Some(serde_json::json!({
            "keep": keep, "archive_after_days": 0, "backup": false, "request_dumps": false
        })),
        ..Default::default()
    };
    prepared_req(&req).unwrap()
}

fn with_policy(keep: serde_json::Value) -> broca_wal::runrec::FrozenConfig {
    prepared(keep).config
}

fn released(at: u64) -> Record {
    Record::SessionReleased(broca_wal::runrec::SessionReleased {
        at_unix_ms: at,
        principal: None,
    })
}

const DAY: u64 = broca_wire::role::DAY_MS;

#[test]
fn a_storage_policy_deletes_at_its_keep_never_while_a_run_is_open() {
    let started = |keep, at| crate::replay::tests::started_with("r1", with_policy(keep), at);
    // keep none: the unreleased hold after the last run ends.
    let mut s = Session::default();
    s.apply(1, started(serde_json::json!("none"), 1_000))
        .unwrap();
    assert_eq!(s.expiry(), Expiry::Held);
    s.apply(2, finished("r1", 5_000)).unwrap();
    assert_eq!(
        s.expiry(),
        Expiry::Delete(5_000 + broca_wire::role::UNRELEASED_HOLD_MS)
    );
    // keep days: that many days after the last activity.
    let mut s = Session::default();
    s.apply(1, started(serde_json::json!({"days": 3}), 1_000))
        .unwrap();
    s.apply(2, finished("r1", 5_000)).unwrap();
    assert_eq!(s.expiry(), Expiry::Delete(5_000 + 3 * DAY));
    // forever: never, until released; then at the later of the release and the activity.
    let mut s = Session::default();
    s.apply(1, started(serde_json::json!("forever"), 1_000))
        .unwrap();
    s.apply(2, released(3_000)).unwrap();
    assert_eq!(s.expiry(), Expiry::Held, "released, its run still open");
    assert_eq!(s.release_deadline(), Some(3_000));
    s.apply(3, finished("r1", 5_000)).unwrap();
    assert_eq!(s.expiry(), Expiry::Delete(5_000));
    // A second release changes nothing.
    s.apply(4, released(9_000)).unwrap();
    assert_eq!(s.released.as_ref().unwrap().at_unix_ms, 3_000);
    let mut s = Session::default();
    s.apply(1, started(serde_json::json!("forever"), 1_000))
        .unwrap();
    s.apply(2, finished("r1", 5_000)).unwrap();
    assert_eq!(s.expiry(), Expiry::Never);
}

#[test]
fn the_first_policy_freezes_and_a_released_session_refuses_sends() {
    use crate::admission::admit_prepared;
    let mut s = Session::default();
    let mut first = prepared(serde_json::json!("forever"));
    first.config.retention_policy = None;
    first.policy_required = true;
    assert_eq!(
        admit_prepared(first, &s, "r0".into(), 1).unwrap_err(),
        Refusal::RetentionRequired
    );
    s.apply(
        1,
        crate::replay::tests::started_with(
            "r1",
            with_policy(serde_json::json!({"days": 2})),
            1_000,
        ),
    )
    .unwrap();
    s.apply(2, finished("r1", 2_000)).unwrap();
    let frozen = serde_json::to_value(s.policy.as_ref().unwrap()).unwrap();
    assert_eq!(
        admit_prepared(
            prepared(serde_json::json!("forever")),
            &s,
            "r2".into(),
            3_000
        )
        .unwrap_err(),
        Refusal::RetentionConflict { frozen }
    );
    assert!(admit_prepared(
        prepared(serde_json::json!({"days": 2})),
        &s,
        "r2".into(),
        3_000
    )
    .is_ok());
    s.apply(3, released(4_000)).unwrap();
    assert_eq!(
        admit_prepared(
            prepared(serde_json::json!({"days": 2})),
            &s,
            "r3".into(),
            5_000
        )
        .unwrap_err(),
        Refusal::SessionReleased {
            delete_after_ms: 4_000
        }
    );
}

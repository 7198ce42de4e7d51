//! Tests of the transport: Retry-After, classification, stream ends and cuts.

use super::*;

#[test]
fn retry_after_prefers_milliseconds_and_accepts_fractional_seconds() {
    assert_eq!(retry_after_ms(Some("1500"), Some("9")), Some(1500));
    assert_eq!(retry_after_ms(None, Some("7")), Some(7000));
    assert_eq!(retry_after_ms(None, Some("0.25")), Some(250));
    assert_eq!(
        retry_after_ms(None, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
        None
    );
    assert_eq!(retry_after_ms(Some("-1"), None), None);
}

#[test]
fn replies_are_classified_by_status_then_by_body() {
    let a = &broca_provider::anthropic::Family;
    let o = &broca_provider::openai_chat::Family;
    let cases: [(&dyn WireFamily, u16, &str, ErrorClass); 8] = [
        (
            a,
            429,
            r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow"}}"#,
            ErrorClass::Transient,
        ),
        (
            a,
            529,
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            ErrorClass::Transient,
        ),
        (
            a,
            401,
            r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
            ErrorClass::AuthRequired,
        ),
        (
            a,
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 215000 tokens > 200000 maximum"}}"#,
            ErrorClass::ContextOverflow,
        ),
        (
            a,
            400,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"messages: field required"}}"#,
            ErrorClass::Permanent,
        ),
        (
            o,
            400,
            r#"{"error":{"message":"maximum context length","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            ErrorClass::ContextOverflow,
        ),
        (o, 403, "forbidden", ErrorClass::AuthRequired),
        (o, 502, "<html>bad gateway</html>", ErrorClass::Transient),
    ];
    for (family, status, body, class) in cases {
        let e = classify_reply(family, status, body.as_bytes(), None, "h");
        assert_eq!(e.class, class, "{status} {body}");
        assert!(
            e.message.starts_with(&format!("HTTP {status} from h: ")),
            "{}",
            e.message
        );
    }
}

#[test]
fn base_urls_come_from_the_catalog_unless_overridden() {
    let mut e = Endpoints::default();
    assert_eq!(
        e.base_url("anthropic").unwrap().to_string(),
        "https://api.anthropic.com"
    );
    e.set("anthropic", "http://127.0.0.1:9/mock").unwrap();
    assert_eq!(
        e.base_url("anthropic").unwrap().to_string(),
        "http://127.0.0.1:9/mock"
    );
    let err = e.set("openai", "http://example.com").unwrap_err();
    assert!(matches!(err, EndpointError::PlainRemote(_)), "{err}");
    assert!(err.to_string().contains("only for loopback"), "{err}");
    assert_eq!(
        base_url_var("openai-responses"),
        "BROCA_BASE_URL_OPENAI_RESPONSES"
    );
}

//! AWS Signature Version 4 over a request's exact bytes (sans-IO; HMAC-SHA256 and SHA-256
//! from ring): the canonical request (method, each path segment URI-encoded once more as
//! every service but S3 requires, the query sorted by name, the signed headers lowercased and
//! sorted, the payload's SHA-256), the string to sign for the date's scope, the signing key
//! derived from the secret through date, region, service and `aws4_request`, and the
//! `Authorization` header. Checked against the published aws-sig-v4 test-suite signatures.

use ring::{digest, hmac};

/// What is signed for.
pub struct Scope<'a> {
    pub access_key_id: &'a str,
    pub secret_access_key: &'a str,
    pub region: &'a str,
    pub service: &'a str,
    /// `YYYYMMDDTHHMMSSZ`.
    pub amz_date: &'a str,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
}

/// URI-encodes `s` as SigV4 does (unreserved characters kept; `/` kept when `keep_slash`).
fn uri_encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        let keep = b.is_ascii_alphanumeric() || b"-_.~".contains(&b) || (keep_slash && b == b'/');
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The canonical URI of an already-encoded path: each segment encoded once more.
pub fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    uri_encode(path, true)
}

/// The canonical query: `name=value` pairs (each encoded) sorted by name, then value.
fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (uri_encode(k, false), uri_encode(v, false))
        })
        .collect();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// The date (`YYYYMMDDTHHMMSSZ`) of `unix_secs`, in UTC.
pub fn amz_date(unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let secs = unix_secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Signs a request: `path` as sent (with its query after `?`), `headers` every header to
/// sign (the host and `x-amz-date` among them), `payload` the body. Returns the signed
/// header names and the signature.
pub fn sign(
    scope: &Scope<'_>,
    method: &str,
    path: &str,
    headers: &[(String, String)],
    payload: &[u8],
) -> (String, String) {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let mut hs: Vec<(String, String)> = headers
        .iter()
        .map(|(n, v)| {
            let v = v.split_whitespace().collect::<Vec<_>>().join(" ");
            (n.to_ascii_lowercase(), v)
        })
        .collect();
    hs.sort();
    let canonical_headers: String = hs.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let signed: String = hs
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical = format!(
        "{method}\n{}\n{}\n{canonical_headers}\n{signed}\n{}",
        canonical_uri(path),
        canonical_query(query),
        sha256_hex(payload)
    );
    let date = &scope.amz_date[..8.min(scope.amz_date.len())];
    let credential_scope = format!("{date}/{}/{}/aws4_request", scope.region, scope.service);
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{credential_scope}\n{}",
        scope.amz_date,
        sha256_hex(canonical.as_bytes())
    );
    let k_date = hmac_sha256(
        format!("AWS4{}", scope.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    let k_region = hmac_sha256(k_date.as_ref(), scope.region.as_bytes());
    let k_service = hmac_sha256(k_region.as_ref(), scope.service.as_bytes());
    let k_signing = hmac_sha256(k_service.as_ref(), b"aws4_request");
    let signature = hex(hmac_sha256(k_signing.as_ref(), to_sign.as_bytes()).as_ref());
    (signed, signature)
}

/// The `Authorization` header value.
pub fn authorization(scope: &Scope<'_>, signed: &str, signature: &str) -> String {
    let date = &scope.amz_date[..8.min(scope.amz_date.len())];
    format!(
        "AWS4-HMAC-SHA256 Credential={}/{date}/{}/{}/aws4_request, SignedHeaders={signed}, Signature={signature}",
        scope.access_key_id, scope.region, scope.service
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope() -> Scope<'static> {
        // The aws-sig-v4 test suite's credentials and time.
        Scope {
            access_key_id: "AKIDEXAMPLE",
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            region: "us-east-1",
            service: "service",
            amz_date: "20150830T123600Z",
        }
    }

    fn base() -> Vec<(String, String)> {
        vec![
            ("Host".into(), "example.amazonaws.com".into()),
            ("X-Amz-Date".into(), "20150830T123600Z".into()),
        ]
    }

    #[test]
    fn the_published_test_suite_signatures() {
        let s = scope();
        // get-vanilla
        let (signed, sig) = sign(&s, "GET", "/", &base(), b"");
        assert_eq!(signed, "host;x-amz-date");
        assert_eq!(
            sig,
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        assert_eq!(
            authorization(&s, &signed, &sig),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        );
        // get-vanilla-query-order-key-case: the query is sorted before it is signed.
        let (_, sig) = sign(&s, "GET", "/?Param2=value2&Param1=value1", &base(), b"");
        assert_eq!(
            sig,
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
        // post-vanilla
        let (_, sig) = sign(&s, "POST", "/", &base(), b"");
        assert_eq!(
            sig,
            "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b"
        );
    }

    #[test]
    fn a_model_id_with_a_colon_is_encoded_again_in_the_canonical_uri() {
        assert_eq!(
            canonical_uri("/model/anthropic.claude-v2%3A1/converse-stream"),
            "/model/anthropic.claude-v2%253A1/converse-stream"
        );
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(amz_date(1_440_938_160), "20150830T123600Z");
        assert_eq!(amz_date(0), "19700101T000000Z");
        assert_eq!(amz_date(951_782_400), "20000229T000000Z");
    }
}

//! The web view: a read-only page at `/ui` over the same management surface a client uses
//! (`sessions.list`, `runs.list`, `session.read`, `run.tool_calls`, the subscription).
//!
//! Sign-in: `broca ui` asks `POST /ui/link` (with the handle, or on the Unix socket) for a
//! one-time link, `/ui/login?token=T`. Opening it spends the token and sets a cookie naming a
//! viewer's sign-in (`HttpOnly`, `SameSite=Strict`, path `/`); the handle itself never
//! reaches the browser, and no URL carries anything after the sign-in. A viewer may read:
//! a method that changes anything is refused `forbidden` (403), and a POST whose `Origin` is
//! not this server's is refused too. Sign-ins are kept in the owner-only file
//! `<state-dir>/ui-sign-ins`, so a browser stays signed in (and its live view reconnects)
//! across a restart of serve; links live in memory only.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use broca_io::http_server::RequestHead;
use broca_wire::{Code, RpcError};

/// How long a sign-in link may wait to be opened.
pub(crate) const LINK_TTL: Duration = Duration::from_secs(120);
/// How long a browser stays signed in.
const SIGN_IN_TTL: Duration = Duration::from_secs(12 * 3600);
/// Links waiting to be opened, at most (the oldest goes first).
const LINKS_MAX: usize = 32;
/// Browsers signed in at once, at most (the oldest is signed out first).
const SIGN_INS_MAX: usize = 64;
/// The cookie's name.
const COOKIE: &str = "broca_ui";
/// Random bytes in a link's token and a sign-in's cookie.
const TOKEN_BYTES: usize = 32;

/// The page, its script and its style, built into the binary.
const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// What every page of the view is sent with: nothing runs but the view's own script, no
/// frame holds it, no referrer leaves it, nothing of it is cached.
pub(crate) const PAGE_HEADERS: [(&str, &str); 5] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
         img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("x-frame-options", "DENY"),
];

/// Who a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// The handle's holder (the bearer handle on TCP, or anyone on the owner-only socket).
    Holder,
    /// A browser signed in through a link: it may read.
    Viewer,
    Nobody,
}

/// One answer of a /ui route.
pub(crate) struct Page {
    pub status: u16,
    pub kind: &'static str,
    pub body: Vec<u8>,
    /// A `set-cookie` value to send with it.
    pub cookie: Option<String>,
}

/// The sign-in links and the signed-in browsers, shared by every shard.
pub(crate) struct UiAuth {
    /// The address a browser reaches this server at (the TCP listener's).
    origin: String,
    links: Mutex<Vec<(String, Instant)>>,
    /// Live sign-ins: the cookie's value and when it was given (Unix seconds).
    sign_ins: Mutex<Vec<(String, u64)>>,
    /// Where the sign-ins are kept (`None`: in memory only).
    file: Option<PathBuf>,
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Whether a sign-in given at `at` (Unix seconds) is still good at `now`.
fn live(at: u64, now: u64) -> bool {
    at <= now && now - at < SIGN_IN_TTL.as_secs()
}

impl UiAuth {
    /// The web view's sign-ins, those kept in `file` read back (a line `<token> <unix
    /// seconds>` each; what does not read as one, or has expired, is dropped).
    pub fn new(listen: std::net::SocketAddr, file: Option<PathBuf>) -> UiAuth {
        // A listener on every address is reached on loopback from this machine.
        let host = if listen.ip().is_unspecified() {
            std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), listen.port())
        } else {
            listen
        };
        let now = unix_now();
        let kept = file
            .as_deref()
            .and_then(|f| broca_owner_only::read_private(f).ok())
            .map(|bytes| {
                String::from_utf8_lossy(&bytes)
                    .lines()
                    .filter_map(|line| {
                        let (token, at) = line.split_once(' ')?;
                        let at: u64 = at.parse().ok()?;
                        let token_ok = token.len() == 2 * TOKEN_BYTES
                            && token.bytes().all(|b| b.is_ascii_hexdigit());
                        (token_ok && live(at, now)).then(|| (token.to_string(), at))
                    })
                    .take(SIGN_INS_MAX)
                    .collect()
            })
            .unwrap_or_default();
        UiAuth {
            origin: format!("http://{host}"),
            links: Mutex::new(Vec::new()),
            sign_ins: Mutex::new(kept),
            file,
        }
    }

    /// Writes the live sign-ins to their file (a failure is logged: the sign-ins still hold
    /// until serve stops).
    fn keep(&self, sign_ins: &[(String, u64)]) {
        let Some(file) = &self.file else { return };
        debug_assert!(
            sign_ins
                .iter()
                .all(|(t, _)| !t.contains(char::is_whitespace)),
            "a sign-in is one word on its line"
        );
        let text: String = sign_ins
            .iter()
            .map(|(t, at)| format!("{t} {at}\n"))
            .collect();
        if let Err(e) = broca_owner_only::write_file(file, text.as_bytes()) {
            tracing::warn!(
                "cannot keep the web view's sign-ins in {}: {e}; they last until serve stops",
                file.display()
            );
        }
    }

    /// A new one-time sign-in link (`POST /ui/link`'s answer).
    pub fn new_link(&self) -> Result<serde_json::Value, RpcError> {
        let token = broca_host::random_hex(TOKEN_BYTES)
            .map_err(|e| RpcError::new(Code::Internal, format!("no sign-in link: {e}")))?;
        let now = Instant::now();
        let mut links = lock(&self.links);
        links.retain(|(_, at)| now.duration_since(*at) < LINK_TTL);
        if links.len() >= LINKS_MAX {
            links.remove(0);
        }
        links.push((token.clone(), now));
        debug_assert!(links.len() <= LINKS_MAX, "links kept within their bound");
        Ok(serde_json::json!({
            "url": format!("{}/ui/login?token={token}", self.origin),
            "expires_in_s": LINK_TTL.as_secs(),
        }))
    }

    /// Spends a link's token: a new sign-in's cookie value, or `None` when the token is
    /// unknown, spent or expired.
    fn spend(&self, token: &str) -> Option<String> {
        let now = Instant::now();
        {
            let mut links = lock(&self.links);
            links.retain(|(_, at)| now.duration_since(*at) < LINK_TTL);
            let at = links.iter().position(|(t, _)| same(t, token))?;
            links.remove(at);
        }
        let session = broca_host::random_hex(TOKEN_BYTES).ok()?;
        let now = unix_now();
        let mut sign_ins = lock(&self.sign_ins);
        sign_ins.retain(|(_, at)| live(*at, now));
        if sign_ins.len() >= SIGN_INS_MAX {
            sign_ins.remove(0);
        }
        sign_ins.push((session.clone(), now));
        debug_assert!(
            sign_ins.len() <= SIGN_INS_MAX,
            "sign-ins kept within their bound"
        );
        self.keep(&sign_ins);
        Some(session)
    }

    /// Whether the request carries a live sign-in's cookie.
    pub fn viewer(&self, head: &RequestHead) -> bool {
        let Some(value) = cookie(head) else {
            return false;
        };
        let now = unix_now();
        lock(&self.sign_ins)
            .iter()
            .any(|(t, at)| live(*at, now) && same(t, value))
    }

    /// Ends the request's sign-in.
    fn sign_out(&self, head: &RequestHead) {
        if let Some(value) = cookie(head) {
            let mut sign_ins = lock(&self.sign_ins);
            sign_ins.retain(|(t, _)| !same(t, value));
            self.keep(&sign_ins);
        }
    }

    /// Whether a viewer's POST comes from this server's own page: its `Origin`, when the
    /// browser sends one, must be this server's (with `SameSite=Strict` a cross-site page
    /// sends no cookie; this refuses the rest).
    pub fn same_origin(&self, head: &RequestHead) -> bool {
        match head.header("origin") {
            None => true,
            Some(origin) => {
                let host = head.header("host").unwrap_or("");
                origin == self.origin || origin == format!("http://{host}")
            }
        }
    }

    /// Answers a `/ui` route.
    pub fn route(&self, head: &RequestHead, access: Access) -> Page {
        let html = "text/html; charset=utf-8";
        match (head.method.as_str(), head.path()) {
            ("GET", "/ui/login") => {
                let spent = head.query("token").and_then(|t| self.spend(&t));
                match spent {
                    // A page that moves on to /ui by itself: the browser's next request is
                    // a same-site navigation, so the strict cookie goes with it.
                    Some(session) => Page {
                        status: 200,
                        kind: html,
                        body: SIGNED_IN_HTML.as_bytes().to_vec(),
                        cookie: Some(format!(
                            "{COOKIE}={session}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
                            SIGN_IN_TTL.as_secs()
                        )),
                    },
                    None => sign_in_page(
                        "This sign-in link was already used or has expired. Run `broca ui` \
                         for a new one.",
                    ),
                }
            }
            // Only the holder gets a link: a viewer cannot mint more sign-ins.
            ("POST", "/ui/link") if access == Access::Holder => match self.new_link() {
                Ok(v) => json_page(200, &serde_json::json!({ "result": v })),
                Err(e) => json_page(
                    e.status(),
                    &serde_json::from_slice(&e.body()).unwrap_or_default(),
                ),
            },
            ("POST", "/ui/link") => {
                let e = RpcError::new(
                    Code::Unauthorized,
                    "a sign-in link is given to the handle's holder only (`broca ui`)",
                );
                json_page(
                    e.status(),
                    &serde_json::from_slice(&e.body()).unwrap_or_default(),
                )
            }
            ("POST", "/ui/logout") => {
                self.sign_out(head);
                Page {
                    status: 200,
                    kind: crate::JSON,
                    body: br#"{"result":"signed_out"}"#.to_vec(),
                    cookie: Some(format!(
                        "{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"
                    )),
                }
            }
            (_, _) if access == Access::Nobody => sign_in_page(
                "Sign in with the link `broca ui` prints (run it where broca serve runs).",
            ),
            ("GET", "/ui" | "/ui/") => asset(INDEX_HTML, html),
            ("GET", "/ui/app.js") => asset(APP_JS, "text/javascript; charset=utf-8"),
            ("GET", "/ui/app.css") => asset(APP_CSS, "text/css; charset=utf-8"),
            (_, _) => {
                let e = RpcError::new(Code::NotFound, format!("no route {}", head.path()));
                json_page(
                    e.status(),
                    &serde_json::from_slice(&e.body()).unwrap_or_default(),
                )
            }
        }
    }
}

/// The page that moves a signed-in browser on to the view.
const SIGNED_IN_HTML: &str = "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta http-equiv=\"refresh\" content=\"0; url=/ui\"><title>broca: signed in</title></head>\
<body><p>Signed in. <a href=\"/ui\">Open the view</a>.</p></body></html>";

fn sign_in_page(why: &str) -> Page {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>broca: sign in\
         </title></head><body><h1>broca</h1><p>{why}</p></body></html>"
    );
    Page {
        status: 401,
        kind: "text/html; charset=utf-8",
        body: body.into_bytes(),
        cookie: None,
    }
}

fn asset(text: &'static str, kind: &'static str) -> Page {
    Page {
        status: 200,
        kind,
        body: text.as_bytes().to_vec(),
        cookie: None,
    }
}

fn json_page(status: u16, v: &serde_json::Value) -> Page {
    Page {
        status,
        kind: crate::JSON,
        body: v.to_string().into_bytes(),
        cookie: None,
    }
}

/// The value of the sign-in cookie, among the request's cookies.
fn cookie(head: &RequestHead) -> Option<&str> {
    head.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
        .filter_map(|(_, v)| std::str::from_utf8(v).ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == COOKIE && !v.is_empty()).then_some(v)
        })
}

/// Equal in time that does not depend on where they differ.
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(method: &str, target: &str, headers: &[(&str, &str)]) -> RequestHead {
        RequestHead {
            method: method.into(),
            target: target.into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect(),
            keep_alive: true,
        }
    }

    fn token_of(link: &serde_json::Value) -> String {
        let url = link["url"].as_str().unwrap();
        url.split_once("token=").unwrap().1.to_string()
    }

    #[test]
    fn a_link_signs_in_once_and_the_cookie_is_strict_and_http_only() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ui-sign-ins");
        let ui = UiAuth::new("127.0.0.1:7411".parse().unwrap(), Some(file.clone()));
        let link = ui.new_link().unwrap();
        assert!(link["url"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:7411/ui/login?token="));
        let token = token_of(&link);
        let login = head("GET", &format!("/ui/login?token={token}"), &[]);
        let page = ui.route(&login, Access::Nobody);
        assert_eq!(page.status, 200);
        let cookie = page.cookie.unwrap();
        assert!(
            cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
            "{cookie}"
        );
        let value = cookie.split(';').next().unwrap().to_string();
        assert!(ui.viewer(&head("GET", "/ui", &[("cookie", &format!("a=b; {value}"))])));
        // Kept: a restarted serve knows the sign-in, not the spent link.
        let restarted = UiAuth::new("127.0.0.1:7411".parse().unwrap(), Some(file.clone()));
        assert!(restarted.viewer(&head("GET", "/ui", &[("cookie", &value)])));
        assert_eq!(restarted.route(&login, Access::Nobody).status, 401);
        // Spent: the same link again signs nobody in.
        let again = ui.route(&login, Access::Nobody);
        assert_eq!(again.status, 401);
        assert!(again.cookie.is_none());
        // A made-up cookie is nobody.
        assert!(!ui.viewer(&head("GET", "/ui", &[("cookie", "broca_ui=00")])));
        // Signing out ends it.
        let out = head("POST", "/ui/logout", &[("cookie", &value)]);
        assert_eq!(ui.route(&out, Access::Viewer).status, 200);
        assert!(!ui.viewer(&head("GET", "/ui", &[("cookie", &value)])));
        let restarted = UiAuth::new("127.0.0.1:7411".parse().unwrap(), Some(file));
        assert!(!restarted.viewer(&head("GET", "/ui", &[("cookie", &value)])));
    }

    #[test]
    fn only_the_handle_gets_a_link_and_pages_need_a_sign_in() {
        let ui = UiAuth::new("0.0.0.0:9".parse().unwrap(), None);
        // A viewer (cookie, no handle) on TCP cannot mint links.
        let viewer_asks = head("POST", "/ui/link", &[("cookie", "broca_ui=x")]);
        assert_eq!(ui.route(&viewer_asks, Access::Viewer).status, 401);
        // The handle's holder can, and a listener on every address is reached on loopback.
        let holder = head("POST", "/ui/link", &[("authorization", "Bearer h")]);
        let page = ui.route(&holder, Access::Holder);
        assert_eq!(page.status, 200);
        let v: serde_json::Value = serde_json::from_slice(&page.body).unwrap();
        assert!(v["result"]["url"]
            .as_str()
            .unwrap()
            .starts_with("http://127.0.0.1:9/"));
        // The page, unsigned, says how to sign in and gives nothing else.
        let page = ui.route(&head("GET", "/ui", &[]), Access::Nobody);
        assert_eq!(page.status, 401);
        assert!(String::from_utf8_lossy(&page.body).contains("broca ui"));
        assert_eq!(
            ui.route(&head("GET", "/ui", &[]), Access::Viewer).status,
            200
        );
        assert_eq!(
            ui.route(&head("GET", "/ui/app.js", &[]), Access::Viewer)
                .status,
            200
        );
    }

    #[test]
    fn a_viewer_post_from_another_origin_is_refused() {
        let ui = UiAuth::new("127.0.0.1:7411".parse().unwrap(), None);
        let own = head(
            "POST",
            "/v1/rpc",
            &[
                ("origin", "http://127.0.0.1:7411"),
                ("host", "127.0.0.1:7411"),
            ],
        );
        assert!(ui.same_origin(&own));
        let other = head(
            "POST",
            "/v1/rpc",
            &[
                ("origin", "http://evil.example"),
                ("host", "127.0.0.1:7411"),
            ],
        );
        assert!(!ui.same_origin(&other));
    }
}

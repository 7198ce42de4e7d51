//! llm-runner/v1 `attachments` through `broca serve`: an upload taken in chunks into the
//! session's content store, cut mid-chunk by a client that went away and resumed at what was
//! received, committed, sent, and its bytes reaching the model (aimock, behind a proxy that
//! keeps each request as broca sent it) and read back by `session.media_read`, also after a
//! restart; an upload over the limit, or of a type the model does not take, refused with
//! nothing written; an open upload gone after a restart.

mod support;

use std::io::Write;
use std::path::Path;

use base64::Engine;
use serde_json::{json, Value};
use support::serve::{rpc, Serve};
use support::{fixture, Aimock, Peer};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// `broca serve` on `state` whose Anthropic models take PNG images and PDFs (a provider-wide
/// row of the catalog overrides), reaching aimock through `proxy`.
fn serve(state: &Path, aimock: &Aimock, proxy: &Peer) -> Serve {
    serve_env(state, aimock, proxy, &[])
}

/// [`serve`] with more environment (a crash point).
fn serve_env(state: &Path, aimock: &Aimock, proxy: &Peer, more: &[(&str, &str)]) -> Serve {
    let catalog = state.join("catalog.json");
    std::fs::write(
        &catalog,
        json!({"models": [{"provider": "anthropic", "model": "*",
            "capability": {"input_modalities": ["text", "image", "pdf"],
                "input_mime_types": ["image/png", "application/pdf"]}}]})
        .to_string(),
    )
    .unwrap();
    let url = proxy.url();
    let mut env = vec![
        ("BROCA_CATALOG_FILE", catalog.to_str().unwrap()),
        ("BROCA_BASE_URL_ANTHROPIC", url.as_str()),
    ];
    env.extend_from_slice(more);
    support::serve::start_env(state, aimock, &[], &env)
}

fn sha256(bytes: &[u8]) -> String {
    cortexkit_role_llm_runner::content_digest::sha256_hex(bytes)
}

/// A PNG's signature and header, then `n` bytes of padding: what the model is sent is what
/// was uploaded, byte for byte, whatever it holds.
fn image(n: usize) -> Vec<u8> {
    let mut b = B64
        .decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAQAAAC1HAwCAAAAC0lEQVR42mP8/x8AAwMCAO+ip1sAAAAASUVORK5CYII=")
        .unwrap();
    b.extend((0..n).map(|i| (i * 7 % 251) as u8));
    b
}

fn ok(s: &Serve, method: &str, params: Value) -> Value {
    let (status, r) = rpc(s, method, params);
    assert_eq!(status, 200, "{method}: {r}");
    r["result"].clone()
}

fn refused(s: &Serve, method: &str, params: Value) -> Value {
    let (status, r) = rpc(s, method, params);
    assert_ne!(status, 200, "{method} was answered: {r}");
    r["error"].clone()
}

fn append(s: &Serve, id: &str, offset: usize, chunk: &[u8]) -> Value {
    ok(
        s,
        "session.upload_append",
        json!({"upload_id": id, "offset": offset, "data": B64.encode(chunk)}),
    )
}

/// The request bodies the proxy passed on, in order.
fn requests(file: &Path) -> Vec<Value> {
    support::recorded_bodies(file)
}

/// aimock on the attachments fixture, behind a proxy that keeps each request in the file.
fn peers(state: &Path) -> (Aimock, std::path::PathBuf, Peer) {
    let aimock = Aimock::start(&fixture("attachments.json"));
    let log = state.join("requests.jsonl");
    let proxy = Peer::recording_proxy(&log, &aimock.url());
    (aimock, log, proxy)
}

/// Begins an upload of `bytes` (a PNG): its id.
fn begin(s: &Serve, bytes: &[u8]) -> String {
    ok(
        s,
        "session.upload_begin",
        json!({"mime": "image/png", "bytes": bytes.len(), "sha256": sha256(bytes)}),
    )["upload_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The session's first send (there are no uploads into a session never written).
fn first(s: &Serve) {
    support::serve::send_until_completed(
        s,
        json!({"prompt": "first", "model": "anthropic/m", "tools": []}),
    );
}

/// Begins, appends whole and commits an upload of `bytes`: its id.
fn upload(s: &Serve, bytes: &[u8]) -> String {
    let id = begin(s, bytes);
    for (i, chunk) in bytes.chunks(2 * 1024 * 1024).enumerate() {
        append(s, &id, i * 2 * 1024 * 1024, chunk);
    }
    ok(s, "session.upload_commit", json!({"upload_id": id}));
    id
}

/// The whole media of digest `sha`, read back in chunks.
fn media_read(s: &Serve, sha: &str) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let r = ok(
            s,
            "session.media_read",
            json!({"sha256": sha, "offset": out.len(), "length": 1_000_000}),
        );
        let data = B64.decode(r["data"].as_str().unwrap()).unwrap();
        if data.is_empty() {
            return out;
        }
        out.extend(data);
    }
}

#[test]
fn an_upload_cut_mid_chunk_resumes_at_what_was_received_and_reaches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let (aimock, log, proxy) = peers(state);
    let s = serve(state, &aimock, &proxy);
    // No uploads into a session never written.
    let e = refused(
        &s,
        "session.upload_begin",
        json!({"mime": "image/png", "bytes": 3, "sha256": sha256(b"abc")}),
    );
    assert_eq!(e["code"], "unknown_session", "{e}");
    first(&s);
    let bytes = image(3_000_000);
    let sha = sha256(&bytes);
    let id = begin(&s, &bytes);
    const CHUNK: usize = 2 * 1024 * 1024;
    assert_eq!(append(&s, &id, 0, &bytes[..CHUNK])["received"], CHUNK);
    // The next chunk's request cut halfway through its body: the client went away.
    let rest = json!({"method": "session.upload_append", "params": {"project_root": "/proj",
        "harness": "h", "session": "s1", "upload_id": id, "offset": CHUNK,
        "data": B64.encode(&bytes[CHUNK..])}})
    .to_string();
    let mut tcp = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        tcp,
        "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: \
         application/json\r\nContent-Length: {}\r\n\r\n",
        s.handle,
        rest.len()
    )
    .unwrap();
    tcp.write_all(&rest.as_bytes()[..rest.len() / 2]).unwrap();
    drop(tcp);
    // Nothing of the cut chunk was taken: the upload resumes at the first chunk's end.
    let status = ok(&s, "session.upload_status", json!({"upload_id": id}));
    assert_eq!(status, json!({"state": "open", "received": CHUNK}));
    // A sender that lost an append's reply learns where to resume.
    let e = refused(
        &s,
        "session.upload_append",
        json!({"upload_id": id, "offset": 0, "data": B64.encode(&bytes[..10])}),
    );
    assert_eq!(
        (&e["code"], &e["detail"]["received"]),
        (&json!("upload_offset_mismatch"), &json!(CHUNK)),
        "{e}"
    );
    let e = refused(&s, "session.upload_commit", json!({"upload_id": id}));
    assert_eq!(e["code"], "upload_size_mismatch", "{e}");
    assert_eq!(
        append(&s, &id, CHUNK, &bytes[CHUNK..])["received"],
        bytes.len()
    );
    // Not in any send yet: its bytes are nobody's to read.
    let e = refused(
        &s,
        "session.media_read",
        json!({"sha256": sha, "offset": 0, "length": 1}),
    );
    assert_eq!(e["code"], "unknown_media", "{e}");
    let committed = ok(&s, "session.upload_commit", json!({"upload_id": id}));
    assert_eq!(
        committed,
        json!({"state": "committed", "sha256": sha, "mime": "image/png", "bytes": bytes.len()})
    );
    let stored = state.join("media");
    let file = std::fs::read_dir(&stored)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join(&sha);
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "named by its digest");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    support::serve::send_until_completed(
        &s,
        json!({"prompt": "look", "model": "anthropic/m", "tools": [],
            "content": [{"type": "upload", "upload_id": id}]}),
    );
    // The model got the image's own bytes, after the prompt.
    let sent = requests(&log);
    let last = sent.last().unwrap();
    let user = last["messages"].as_array().unwrap().last().unwrap();
    assert_eq!(user["content"][0]["text"], "look", "{user}");
    let source = &user["content"][1]["source"];
    assert_eq!(source["media_type"], "image/png");
    assert_eq!(B64.decode(source["data"].as_str().unwrap()).unwrap(), bytes);
    // A default read shows the marker; blocks the stored block; media_read the bytes.
    let page = ok(&s, "session.read", json!({}));
    let marker = format!(
        "[media not shown: kind=image mime=image/png bytes={} sha256={} reason=not_requested]",
        bytes.len(),
        &sha[..12]
    );
    assert!(page.to_string().contains(&marker), "{page}");
    assert!(!page.to_string().contains(&sha));
    let blocks = ok(&s, "session.read", json!({"media": "blocks"}));
    assert!(blocks.to_string().contains(&sha));
    assert_eq!(media_read(&s, &sha), bytes);
    // After a restart the send's media are still read back; an open upload is gone.
    let open = ok(
        &s,
        "session.upload_begin",
        json!({"mime": "image/png", "bytes": 3, "sha256": sha256(b"abc")}),
    )["upload_id"]
        .as_str()
        .unwrap()
        .to_string();
    append(&s, &open, 0, b"ab");
    drop(s); // killed
    let s = serve(state, &aimock, &proxy);
    assert_eq!(media_read(&s, &sha), bytes);
    assert_eq!(
        ok(&s, "session.upload_status", json!({"upload_id": open})),
        json!({"state": "gone", "received": 0})
    );
    let e = refused(
        &s,
        "session.send",
        json!({"prompt": "look", "model": "anthropic/m", "tools": [],
            "content": [{"type": "upload", "upload_id": open}]}),
    );
    assert_eq!(e["code"], "upload_gone", "{e}");
    // `broca wal verify` checks the content store against the records: intact, then a
    // damaged medium named.
    let verify = || {
        support::broca(state)
            .args(["wal", "verify"])
            .output()
            .unwrap()
    };
    let o = verify();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{out}");
    assert!(out.contains("1 media in its content store"), "{out}");
    std::fs::write(&file, b"damaged").unwrap();
    let o = verify();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&sha) && err.contains("no longer match"),
        "{err}"
    );
}

#[test]
fn uploads_past_a_limit_or_of_a_type_the_model_does_not_take_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let (aimock, _log, proxy) = peers(state);
    let s = serve(state, &aimock, &proxy);
    first(&s);
    let wal = std::fs::read_dir(state.join("wal"))
        .unwrap()
        .find_map(|e| {
            let p = e.unwrap().path();
            (p.extension().is_some_and(|x| x == "wal")).then_some(p)
        })
        .unwrap();
    let before = std::fs::read(&wal).unwrap();
    // Past the 64 MiB of one upload: refused by name, nothing written.
    let e = refused(
        &s,
        "session.upload_begin",
        json!({"mime": "image/png", "bytes": 64 * 1024 * 1024 + 1, "sha256": sha256(b"x")}),
    );
    assert_eq!(
        (&e["code"], &e["detail"]["field"]),
        (&json!("invalid_params"), &json!("bytes")),
        "{e}"
    );
    // A chunk over 2 MiB decoded.
    let id = ok(
        &s,
        "session.upload_begin",
        json!({"mime": "image/gif", "bytes": 6, "sha256": sha256(b"GIF89a")}),
    )["upload_id"]
        .as_str()
        .unwrap()
        .to_string();
    let e = refused(
        &s,
        "session.upload_append",
        json!({"upload_id": id, "offset": 0, "data": B64.encode(vec![0u8; 2 * 1024 * 1024 + 1])}),
    );
    assert_eq!(e["code"], "upload_chunk_too_large", "{e}");
    assert_eq!(
        ok(&s, "session.upload_status", json!({"upload_id": id})),
        json!({"state": "open", "received": 0})
    );
    append(&s, &id, 0, b"GIF89a");
    ok(&s, "session.upload_commit", json!({"upload_id": id}));
    let after_uploads = std::fs::read(&wal).unwrap();
    // A GIF to a model whose catalog row takes PNG alone: refused, naming the upload.
    let e = refused(
        &s,
        "session.send",
        json!({"prompt": "look", "model": "anthropic/m", "tools": [], "send_id": "gif-1",
            "content": [{"type": "upload", "upload_id": id}]}),
    );
    assert_eq!(e["code"], "media_unsupported", "{e}");
    assert!(e["message"].as_str().unwrap().contains("image/gif"), "{e}");
    let e = refused(
        &s,
        "session.send",
        json!({"prompt": "look", "model": "anthropic/m", "tools": [],
            "content": [{"type": "upload", "upload_id": "upl_never"}]}),
    );
    assert_eq!(e["code"], "unknown_upload", "{e}");
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        after_uploads,
        "a refused send writes nothing"
    );
    assert!(after_uploads.len() >= before.len());
    let (_, r) = rpc(&s, "session.send_status", json!({"send_id": "gif-1"}));
    assert_eq!(r["error"]["code"], "unknown_send", "{r}");
}

#[test]
fn broca_send_attach_uploads_each_file_then_sends_them_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let (aimock, log, proxy) = peers(state);
    let s = serve(state, &aimock, &proxy);
    first(&s);
    let png = state.join("shot.png");
    let pdf = state.join("notes.pdf");
    std::fs::write(&png, image(100)).unwrap();
    std::fs::write(&pdf, b"%PDF-1.7 notes").unwrap();
    let base = support::serve::CLI_SESSION;
    let o = support::broca(state)
        .arg("send")
        .args(base)
        .arg("--attach")
        .arg(&png)
        .arg("--attach")
        .arg(&pdf)
        .arg("look")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let sent = requests(&log);
    let user = sent.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let content = user["content"].as_array().unwrap();
    assert_eq!(
        content
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["text", "image", "document"],
        "{user}"
    );
    assert_eq!(
        B64.decode(content[2]["source"]["data"].as_str().unwrap())
            .unwrap(),
        b"%PDF-1.7 notes"
    );
    // A file of a type broca does not carry is refused before anything is sent.
    let txt = state.join("notes.txt");
    std::fs::write(&txt, "x").unwrap();
    let o = support::broca(state)
        .arg("send")
        .args(base)
        .arg("--attach")
        .arg(&txt)
        .arg("look")
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("notes.txt") && err.contains(".pdf"), "{err}");
    assert_eq!(requests(&log).len(), sent.len(), "nothing was sent");
}

#[test]
fn a_kill_right_after_a_commit_is_durable_keeps_the_upload_committed() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let (aimock, _log, proxy) = peers(state);
    // broca aborts right after the commit's record is durable, before its answer.
    let mut s = serve_env(
        state,
        &aimock,
        &proxy,
        &[("BROCA_CRASH_AT", "upload_committed:1")],
    );
    first(&s);
    let bytes = image(5_000);
    let sha = sha256(&bytes);
    let id = begin(&s, &bytes);
    append(&s, &id, 0, &bytes);
    let body = json!({"method": "session.upload_commit", "params": {"project_root": "/proj",
        "harness": "h", "session": "s1", "upload_id": id}})
    .to_string();
    let mut c = std::net::TcpStream::connect(&s.addr).unwrap();
    write!(
        c,
        "POST /v1/rpc HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Length: \
         {}\r\nConnection: close\r\n\r\n{body}",
        s.handle,
        body.len()
    )
    .unwrap();
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut c, &mut answer);
    assert!(answer.is_empty(), "answered before the crash: {answer:?}");
    let died = s.child.wait().unwrap();
    assert!(!died.success(), "broca aborted at its crash point");
    drop(s);
    let s = serve(state, &aimock, &proxy);
    assert_eq!(
        ok(&s, "session.upload_status", json!({"upload_id": id})),
        json!({"state": "committed", "received": bytes.len()})
    );
    support::serve::send_until_completed(
        &s,
        json!({"prompt": "look", "model": "anthropic/m", "tools": [],
            "content": [{"type": "upload", "upload_id": id}]}),
    );
    assert_eq!(media_read(&s, &sha), bytes);
}

#[test]
fn a_packed_sessions_media_go_into_its_container_and_come_back_with_its_restore() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path();
    let (aimock, log, proxy) = peers(state);
    let s = serve(state, &aimock, &proxy);
    first(&s);
    let bytes = image(10_000);
    let sha = sha256(&bytes);
    let id = upload(&s, &bytes);
    support::serve::send_until_completed(
        &s,
        json!({"prompt": "look", "model": "anthropic/m", "tools": [],
            "content": [{"type": "upload", "upload_id": id}]}),
    );
    drop(s);
    // The WAL packed into a container, and the session's media with it.
    let o = support::broca(state)
        .args(["archive", "pack", "--idle-days", "0"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let live = std::fs::read_dir(state.join("wal"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "wal")
        })
        .count();
    assert_eq!(live, 0, "the WAL was packed");
    let store = std::fs::read_dir(state.join("media"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect::<Vec<_>>();
    assert!(
        store.is_empty(),
        "its media went into the container: {store:?}"
    );
    let o = support::broca(state)
        .args(["archive", "verify"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = serve(state, &aimock, &proxy);
    assert_eq!(media_read(&s, &sha), bytes, "read from the container");
    // A send restores the session; the model gets the earlier image again with the history.
    let before = requests(&log).len();
    support::serve::send_until_completed(
        &s,
        json!({"prompt": "look", "model": "anthropic/m", "tools": []}),
    );
    let sent = requests(&log);
    assert_eq!(sent.len(), before + 1);
    let images = sent.last().unwrap()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "image")
        .count();
    assert_eq!(images, 1, "the restored session's image reached the model");
    let back: Vec<_> = std::fs::read_dir(state.join("media"))
        .unwrap()
        .map(|e| e.unwrap().path().join(&sha))
        .collect();
    assert_eq!(back.len(), 1);
    assert_eq!(
        std::fs::read(&back[0]).unwrap(),
        bytes,
        "restored with its WAL"
    );
}

//! The reading commands of the client: `broca ls` (the sessions, newest activity first) and
//! `broca read` (a session's transcript), and how they show times and messages.

use super::*;

pub(super) fn ls(c: Common, mut pargs: pico_args::Arguments) -> Result<u8, String> {
    let mut params = json!({});
    // The project root and harness filter only when given (no default filters).
    if c.project_root_given {
        params["project_root"] = c.project_root.clone().into();
    }
    if c.harness_given {
        params["harness"] = c.harness.clone().into();
    }
    if let Some(s) = opt(&mut pargs, "--state")? {
        params["state"] = s.into();
    }
    if let Some(t) = opt(&mut pargs, "--since")? {
        params["since_ms"] = crate::cli::store::parse_time(&t)?.into();
    }
    if let Some(n) = pargs
        .opt_value_from_str::<_, u32>("--limit")
        .map_err(|e| format!("--limit: {e}"))?
    {
        params["limit"] = n.into();
    }
    if let Some(cur) = opt(&mut pargs, "--cursor")? {
        params["cursor"] = cur.into();
    }
    let all = pargs.contains("--all");
    positional(pargs)?
        .is_empty()
        .then_some(())
        .ok_or("`broca ls` takes no positional argument")?;
    let mut first = true;
    loop {
        let page = match c.daemon.rpc(Method::SessionsList.as_str(), params.clone()) {
            Ok(v) => v,
            Err(e) => return Ok(failed(e)),
        };
        if c.json {
            broca_io::outln!("{page}");
        } else {
            print_sessions(&page, first);
            first = false;
        }
        match page["next_cursor"].as_str() {
            Some(next) if all => params["cursor"] = next.into(),
            Some(next) => {
                if !c.json {
                    broca_io::errln!("(more: --cursor {next}, or --all)");
                }
                return Ok(EXIT_OK);
            }
            None => return Ok(EXIT_OK),
        }
    }
}

/// A page of `sessions.list` as rows, under the header when it is the `first`.
fn print_sessions(page: &Value, first: bool) {
    if first {
        broca_io::outln!(
            "{:<24} {:<10} {:<12} {:<20} PROJECT",
            "SESSION",
            "HARNESS",
            "STATE",
            "ACTIVE"
        );
    }
    for s in page["sessions"].as_array().into_iter().flatten() {
        broca_io::outln!(
            "{:<24} {:<10} {:<12} {:<20} {}",
            s["session"].as_str().unwrap_or(""),
            s["harness"].as_str().unwrap_or(""),
            s["last_run"]["state"].as_str().unwrap_or("-"),
            when(s["active_at_ms"].as_u64().unwrap_or(0)),
            s["project_root"].as_str().unwrap_or("")
        );
    }
}

/// A Unix-ms time as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(super) fn when(ms: u64) -> String {
    // SigV4's date (`YYYYMMDDTHHMMSSZ`), spelled for a person.
    let d = broca_provider::sigv4::amz_date(ms / 1000);
    let n = d.len();
    match (d.get(..n - 12), d.get(n - 12..n - 10), d.get(n - 10..n - 8)) {
        (Some(y), Some(m), Some(day)) => format!(
            "{y}-{m}-{day} {}:{}:{}",
            &d[n - 7..n - 5],
            &d[n - 5..n - 3],
            &d[n - 3..n - 1]
        ),
        _ => d,
    }
}

pub(super) fn read(c: Common, mut pargs: pico_args::Arguments) -> Result<u8, String> {
    let mut params = c.params()?;
    let from = pargs
        .opt_value_from_str::<_, u64>("--from")
        .map_err(|e| format!("--from: {e}"))?;
    let limit = pargs
        .opt_value_from_str::<_, u64>("--limit")
        .map_err(|e| format!("--limit: {e}"))?;
    positional(pargs)?
        .is_empty()
        .then_some(())
        .ok_or("`broca read` takes no positional argument")?;
    params["from_ordinal"] = from.unwrap_or(0).into();
    let limit = limit.unwrap_or(200);
    params["limit"] = limit.into();
    let page = match c.daemon.rpc(Method::SessionRead.as_str(), params) {
        Ok(v) => v,
        Err(e) => return Ok(failed(e)),
    };
    if c.json {
        broca_io::outln!("{page}");
        return Ok(EXIT_OK);
    }
    let messages = page["messages"].as_array().cloned().unwrap_or_default();
    for m in &messages {
        broca_io::outln!("{}", message_text(m));
    }
    // A full page may have more after it.
    if messages.len() as u64 >= limit {
        if let Some(last) = messages.last().and_then(|m| m["ordinal"].as_u64()) {
            broca_io::errln!("(more: --from {})", last + 1);
        }
    }
    Ok(EXIT_OK)
}

/// A transcript entry as a person reads it: `#ordinal role: text`, tool calls and results by
/// name. A content block is `{"type": T, ...}` or the role's `{T: {...}}`.
pub(super) fn message_text(entry: &Value) -> String {
    let ordinal = entry["ordinal"].as_u64().unwrap_or(0);
    let m = if entry["message"].is_object() {
        &entry["message"]
    } else {
        entry
    };
    let role = m["role"].as_str().unwrap_or("?");
    let mut parts = Vec::new();
    let blocks = match &m["content"] {
        Value::String(t) => {
            parts.push(t.clone());
            Vec::new()
        }
        Value::Array(blocks) => blocks.clone(),
        _ => Vec::new(),
    };
    for b in &blocks {
        let (kind, body) = match (b["type"].as_str(), b.as_object()) {
            (Some(t), _) => (t.to_string(), b),
            (None, Some(o)) if o.len() == 1 => {
                let (k, v) = o.iter().next().expect("one member");
                (k.clone(), v)
            }
            _ => continue,
        };
        let text = |v: &Value| match v {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
        match kind.as_str() {
            "text" => parts.push(text(&body["text"])),
            "tool_use" | "tool_call" => parts.push(format!(
                "[tool call {} {}]",
                body["name"].as_str().unwrap_or("?"),
                cut(&text(&body["input"]).replace('\n', " "))
            )),
            "tool_result" => parts.push(format!(
                "[tool result{}: {}]",
                if body["is_error"] == true {
                    ", error"
                } else {
                    ""
                },
                cut(&text(&body["content"]))
            )),
            "thinking" | "reasoning" => parts.push("[thinking]".into()),
            other => parts.push(format!("[{other}]")),
        }
    }
    format!("#{ordinal} {role}: {}", parts.join(" "))
}

pub(super) fn cut(s: &str) -> String {
    const MAX: usize = 200;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

//! A subscription's two lanes as every front carries them: where it starts ([`SubFrom`],
//! parsed from an HTTP query or a route's params), what it delivers ([`SubItem`]: control
//! units with their [`Cursor`], display deltas, gaps, its end), and one encoder per framing:
//! server-sent events ([`sse`]), WebSocket text messages ([`websocket`]) and the daemon's
//! STREAM_DATA bodies ([`stream_data`]).

use std::borrow::Cow;

use serde_json::{json, Map, Value};

use crate::{Code, RpcError};

/// A control unit's address: the WAL record's seq and the unit's index within that record's
/// projection (`<wal_seq>.<sub_index>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    pub seq: u64,
    pub sub: u32,
}

impl Cursor {
    /// Before every unit.
    pub const START: Cursor = Cursor { seq: 0, sub: 0 };

    /// Parses `<wal_seq>.<sub_index>`.
    pub fn parse(text: &str) -> Option<Cursor> {
        let (seq, sub) = text.trim().split_once('.')?;
        Some(Cursor {
            seq: seq.parse().ok()?,
            sub: sub.parse().ok()?,
        })
    }

    /// The last unit a record of `seq` can have (for "everything up to seq").
    pub fn end_of(seq: u64) -> Cursor {
        Cursor { seq, sub: u32::MAX }
    }

    /// A position strictly after every unit of the record `seq`, as a page's `head` holds it
    /// and `session.subscribe` takes it back: `{"after": "<seq>.<u32::MAX>"}`.
    pub fn head_position(seq: u64) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert(
            "after".into(),
            Value::String(Cursor::end_of(seq).to_string()),
        );
        m
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.seq, self.sub)
    }
}

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubFrom {
    /// From the session's first unit.
    Start,
    /// From what becomes durable next.
    Live,
    /// Strictly after this cursor.
    After(Cursor),
}

fn invalid(why: impl Into<String>) -> RpcError {
    RpcError::new(Code::InvalidParams, why)
}

impl SubFrom {
    /// `start`, `live` or a cursor, as an HTTP subscription spells it (`Last-Event-ID`, else
    /// `from`; with neither, live).
    pub fn parse(text: Option<&str>) -> Result<SubFrom, RpcError> {
        match text {
            None | Some("live") => Ok(SubFrom::Live),
            Some("start") => Ok(SubFrom::Start),
            Some(c) => Cursor::parse(c).map(SubFrom::After).ok_or_else(|| {
                invalid(format!(
                    "`{}` is not start, live or a cursor <wal_seq>.<sub_index>",
                    c.escape_debug()
                ))
                .with_field("from")
            }),
        }
    }

    /// A route's `session.subscribe` request: `params.from` is `start`, `live` (the default)
    /// or a position an event's `cursor` or a page's `head` gave, `{"after": "<seq>.<sub>"}`
    /// (the cursor's text alone is taken too). A route names its session, so `from` is the
    /// only parameter.
    pub fn from_route_request(body: &[u8]) -> Result<SubFrom, RpcError> {
        Ok(route_subscription(body)?.0)
    }
}

/// A route's `session.subscribe` request: where it starts ([`SubFrom::from_route_request`])
/// and the display `limits` it asks `tool_started.arguments` to be cut to (llm-runner/v1
/// `live_events`).
pub fn route_subscription(
    body: &[u8],
) -> Result<(SubFrom, Option<cortexkit_role_llm_runner::display::Limits>), RpcError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| invalid(e.to_string()))?;
    let params = v.get("params").cloned().unwrap_or_else(|| json!({}));
    let Some(params) = params.as_object() else {
        return Err(invalid("`params` is not an object"));
    };
    let limits = match params.get("limits") {
        None => None,
        Some(l) => Some(serde_json::from_value(l.clone()).map_err(|e| {
            invalid(format!(
                "`limits` is not {{arguments_bytes, result_bytes, error_result_bytes}}: {e}"
            ))
            .with_field("limits")
        })?),
    };
    Ok((SubFrom::from_params(params)?, limits))
}

impl SubFrom {
    fn from_params(params: &serde_json::Map<String, Value>) -> Result<SubFrom, RpcError> {
        if let Some(k) = params.keys().find(|k| *k != "from" && *k != "limits") {
            return Err(invalid(format!(
                "unknown parameter `{}` for session.subscribe (a route names its session)",
                k.escape_debug()
            ))
            .with_field(k.as_str()));
        }
        let cursor = match params.get("from") {
            None => return Ok(SubFrom::Live),
            Some(Value::String(s)) if s == "live" => return Ok(SubFrom::Live),
            Some(Value::String(s)) if s == "start" => return Ok(SubFrom::Start),
            Some(Value::String(c)) => Some(c.as_str()),
            Some(Value::Object(at)) if at.len() == 1 => at.get("after").and_then(Value::as_str),
            Some(_) => None,
        };
        cursor
            .and_then(Cursor::parse)
            .map(SubFrom::After)
            .ok_or_else(|| {
                invalid(format!(
                    "`from` is not start, live or a position {{\"after\": \"<wal_seq>.<sub_index>\"}}: {}",
                    params["from"]
                ))
                .with_field("from")
            })
    }
}

/// Whether a request body asks for `session.subscribe` (looked up without parsing the rest):
/// a route's subscription is held open, unlike its other requests.
pub fn is_subscribe(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Method<'a> {
        #[serde(borrow)]
        method: std::borrow::Cow<'a, str>,
    }
    serde_json::from_slice::<Method<'_>>(body)
        .is_ok_and(|m| m.method == cortexkit_role_llm_runner::ops::SESSION_SUBSCRIBE)
}

/// What a subscription delivers, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubItem {
    /// The subscription is accepted: control units follow (always the first item, unless
    /// [`SubItem::Refused`]).
    Ready,
    /// The subscription is refused (the only item): a cursor beyond the session's head.
    Refused(String),
    /// A control unit (its JSON text), its cursor, and the typed event it carries (llm-runner/v1
    /// `live_events`, JSON text), if any.
    Control {
        cursor: Cursor,
        unit: String,
        event: Option<String>,
    },
    /// A display delta.
    Display(Delta),
    /// Display deltas were dropped (this many since the last report).
    Gap(u64),
    /// The subscription ends (the reason says what the client should do).
    End(String),
}

impl SubItem {
    /// Whether the subscription is over after this item.
    pub fn is_last(&self) -> bool {
        matches!(self, SubItem::End(_) | SubItem::Refused(_))
    }
}

/// A display-lane item: its typed event (llm-runner/v1 §7.1: `text_delta`, `reasoning_delta`,
/// `tool_input_delta` with the message's `mid` and the part's key, or `display_reset`, as
/// JSON text), and for an answer's text delta the text alone (what the HTTP surface shows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub event: String,
    pub text: Option<String>,
}

/// An item as a server-sent event: a control unit with `id: <cursor>`, the others named by
/// `event:` (`display`, `display_gap`, `end`) with no id. [`SubItem::Ready`] is nothing, and
/// so is a display item that is not an answer's text.
pub fn sse(item: &SubItem) -> Vec<u8> {
    let mut out = Vec::new();
    sse_into(item, &mut out);
    out
}

/// [`sse`], appended to `out`: a subscriber's items that go out in one write are written
/// into one buffer, each unit's text copied once.
pub fn sse_into(item: &SubItem, out: &mut Vec<u8>) {
    let Some((id, event, data)) = http_parts(item) else {
        return;
    };
    // Compact JSON, so one `data:` line carries it whole.
    assert!(!data.contains('\n'), "an event's data is one line");
    out.reserve(data.len() + 32);
    if let Some(id) = id {
        assert!(!id.contains('\n'), "an event's id is one line");
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(id.as_bytes());
        out.push(b'\n');
    }
    if let Some(e) = event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(data.as_bytes());
    out.extend_from_slice(b"\n\n");
}

/// An item as a WebSocket text message: `{"id", "unit"}` for a control unit, `{"event",
/// "data"}` for the others. [`SubItem::Ready`] is none.
pub fn websocket(item: &SubItem) -> Option<String> {
    let (id, event, data) = http_parts(item)?;
    Some(match (id, event) {
        (Some(id), _) => format!("{{\"id\":\"{id}\",\"unit\":{data}}}"),
        (None, Some(e)) => format!("{{\"event\":\"{e}\",\"data\":{data}}}"),
        (None, None) => data.into_owned(),
    })
}

/// The id, event name and data of an item on the HTTP surface (a control unit's text
/// borrowed, not copied).
fn http_parts(item: &SubItem) -> Option<(Option<String>, Option<&'static str>, Cow<'_, str>)> {
    let owned = |v: Value| Cow::Owned(v.to_string());
    Some(match item {
        SubItem::Control { cursor, unit, .. } => {
            (Some(cursor.to_string()), None, Cow::Borrowed(unit.as_str()))
        }
        SubItem::Display(Delta { text: None, .. }) => return None,
        SubItem::Display(Delta {
            text: Some(text), ..
        }) => (None, Some("display"), owned(json!({ "text": text }))),
        SubItem::Gap(n) => (None, Some("display_gap"), owned(json!({ "dropped": n }))),
        SubItem::End(why) | SubItem::Refused(why) => {
            (None, Some("end"), owned(json!({ "reason": why })))
        }
        SubItem::Ready => return None,
    })
}

/// How a route's subscription encodes its items: each frame numbered (`seq`, from
/// [`cortexkit_role_llm_runner::live::FIRST_SEQ`], one more per frame across both lanes), and
/// the subscriber's `limits` applied to `tool_started.arguments`.
#[derive(Debug, Clone)]
pub struct StreamEncoder {
    next_seq: u64,
    limits: Option<cortexkit_role_llm_runner::display::Limits>,
}

impl StreamEncoder {
    pub fn new(limits: Option<cortexkit_role_llm_runner::display::Limits>) -> StreamEncoder {
        StreamEncoder {
            next_seq: cortexkit_role_llm_runner::live::FIRST_SEQ,
            limits,
        }
    }

    /// An item as the body of a daemon STREAM_DATA frame (the role's event shapes: `kind`,
    /// `seq`, a control unit's cursor as `{"after"}` and its typed `event`), and whether the
    /// frame may be shed (a display delta). [`SubItem::Ready`] is none.
    pub fn encode(&mut self, item: &SubItem) -> Option<(String, bool)> {
        let (mut body, sheddable): (serde_json::Map<String, Value>, bool) = match item {
            SubItem::Control {
                cursor,
                unit,
                event,
            } => {
                let mut m = serde_json::Map::new();
                m.insert("kind".into(), "control".into());
                m.insert("type".into(), "control".into());
                m.insert("cursor".into(), json!({ "after": cursor.to_string() }));
                m.insert("unit".into(), raw(unit));
                if let Some(e) = event {
                    m.insert("event".into(), self.cut(raw(e)));
                }
                (m, false)
            }
            SubItem::Display(d) => {
                let mut m = serde_json::Map::new();
                m.insert("kind".into(), "display".into());
                m.insert("type".into(), "display".into());
                m.insert("event".into(), raw(&d.event));
                if let Some(text) = &d.text {
                    m.insert("text".into(), text.clone().into());
                }
                (m, true)
            }
            SubItem::Gap(n) => (gap_body(*n), false),
            SubItem::End(why) | SubItem::Refused(why) => {
                let mut m = serde_json::Map::new();
                m.insert("type".into(), "end".into());
                m.insert("reason".into(), why.clone().into());
                (m, false)
            }
            SubItem::Ready => return None,
        };
        body.insert("seq".into(), self.next_seq.into());
        self.next_seq += 1;
        Some((Value::Object(body).to_string(), sheddable))
    }

    /// The STREAM_DATA body saying that `dropped` display deltas were shed.
    pub fn display_gap(&mut self, dropped: u64) -> String {
        let mut body = gap_body(dropped);
        body.insert("seq".into(), self.next_seq.into());
        self.next_seq += 1;
        Value::Object(body).to_string()
    }

    /// `event` with a `tool_started`'s arguments cut to the subscriber's limits.
    fn cut(&self, mut event: Value) -> Value {
        let Some(limits) = &self.limits else {
            return event;
        };
        if event["type"] != "tool_started" {
            return event;
        }
        if let Some(args) = event["arguments"].as_str() {
            let (text, cut) = cortexkit_role_llm_runner::display::cut(args, limits.arguments_bytes);
            event["arguments"] = text.into();
            if cut {
                event["arguments_truncated"] = true.into();
            }
        }
        event
    }
}

/// JSON text made earlier by serializing a value.
fn raw(text: &str) -> Value {
    serde_json::from_str(text).expect("a unit or event is JSON it was serialized from")
}

/// A display gap's frame: the display lane's `display_gap` event.
fn gap_body(dropped: u64) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("kind".into(), "display".into());
    m.insert("type".into(), "display_gap".into());
    m.insert("dropped".into(), dropped.into());
    m.insert(
        "event".into(),
        json!({"type": "display_gap", "dropped": dropped}),
    );
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_framing_carries_a_unit_with_its_cursor_and_ready_as_nothing() {
        let unit = SubItem::Control {
            cursor: Cursor { seq: 7, sub: 1 },
            unit: r#"{"type":"step_started"}"#.into(),
            event: Some(
                r#"{"type":"tool_started","mid":"6","tool_call_id":"c","name":"t","arguments":"{\"a\":\"bbbb\"}"}"#
                    .into(),
            ),
        };
        assert_eq!(
            String::from_utf8(sse(&unit)).unwrap(),
            "id: 7.1\ndata: {\"type\":\"step_started\"}\n\n"
        );
        let ws: Value = serde_json::from_str(&websocket(&unit).unwrap()).unwrap();
        assert_eq!(ws["id"], "7.1");
        assert_eq!(ws["unit"]["type"], "step_started");
        // A route's frames: numbered from 1 across both lanes, the event beside the unit, the
        // subscriber's limits cutting a call's arguments.
        let limits = cortexkit_role_llm_runner::display::Limits::new(4, 8, 8);
        let mut enc = StreamEncoder::new(Some(limits));
        let (body, shed) = enc.encode(&unit).unwrap();
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            (body["cursor"]["after"].as_str(), shed, body["seq"].as_u64()),
            (Some("7.1"), false, Some(1))
        );
        assert_eq!(body["event"]["arguments"], "{\"a\"");
        assert_eq!(body["event"]["arguments_truncated"], true);
        let display = SubItem::Display(Delta {
            event: r#"{"type":"text_delta","message_id":"","delta":"hi","mid":"6","part":"0"}"#
                .into(),
            text: Some("hi".into()),
        });
        assert_eq!(
            String::from_utf8(sse(&display)).unwrap(),
            "event: display\ndata: {\"text\":\"hi\"}\n\n"
        );
        let (body, shed) = enc.encode(&display).unwrap();
        let body: Value = serde_json::from_str(&body).unwrap();
        assert!(shed, "a display delta may be shed");
        assert_eq!(
            (body["kind"].as_str(), body["seq"].as_u64()),
            (Some("display"), Some(2))
        );
        assert_eq!(body["event"]["type"], "text_delta");
        let gap: Value = serde_json::from_str(&enc.display_gap(3)).unwrap();
        assert_eq!(
            (gap["event"]["dropped"].as_u64(), gap["seq"].as_u64()),
            (Some(3), Some(3))
        );
        let reset = SubItem::Display(Delta {
            event: r#"{"type":"display_reset"}"#.into(),
            text: None,
        });
        assert!(
            sse(&reset).is_empty(),
            "the HTTP lanes show the answer's text alone"
        );
        assert!(sse(&SubItem::Ready).is_empty());
        assert!(websocket(&SubItem::Ready).is_none() && enc.encode(&SubItem::Ready).is_none());
        assert!(SubItem::End("x".into()).is_last() && !unit.is_last());
    }

    #[test]
    fn a_start_is_parsed_the_same_from_a_query_and_a_route() {
        assert_eq!(SubFrom::parse(None).unwrap(), SubFrom::Live);
        assert_eq!(SubFrom::parse(Some("start")).unwrap(), SubFrom::Start);
        let at = SubFrom::After(Cursor { seq: 3, sub: 0 });
        assert_eq!(SubFrom::parse(Some("3.0")).unwrap(), at);
        assert_eq!(
            SubFrom::parse(Some("3")).unwrap_err().code,
            Code::InvalidParams
        );
        let route = |params: &str| {
            SubFrom::from_route_request(
                format!(r#"{{"method":"session.subscribe","params":{params}}}"#).as_bytes(),
            )
        };
        assert_eq!(route(r#"{"from":{"after":"3.0"}}"#).unwrap(), at);
        assert_eq!(route(r#"{"from":"3.0"}"#).unwrap(), at);
        assert_eq!(route("{}").unwrap(), SubFrom::Live);
        let e = route(r#"{"session":"s"}"#).unwrap_err();
        assert_eq!(
            (e.code, e.detail["field"].as_str()),
            (Code::InvalidParams, Some("session"))
        );
        assert_eq!(route(r#"{"from":7}"#).unwrap_err().detail["field"], "from");
    }

    #[test]
    fn a_head_position_is_after_every_unit_of_its_record() {
        let head = Cursor::head_position(9);
        let after = Cursor::parse(head["after"].as_str().unwrap()).unwrap();
        assert!(after > Cursor { seq: 9, sub: 1000 } && after < Cursor { seq: 10, sub: 0 });
    }
}

//! Each session's rendered messages, kept between its requests. A conversation only grows
//! (its messages are shared, immutable `Arc`s), so a step's request renders the messages the
//! last one did not hold and copies the rest from here, instead of escaping the whole
//! conversation again at every step.
//!
//! An entry is a session's: it is keyed by its first message (the same `Arc` at every step of
//! a session) and holds, per wire family, the bytes of the messages array's contents from
//! its first message up to the one before the last (the last carries the cache breakpoint,
//! and is rendered at each request). It is used only when each message it holds is, by
//! pointer, the request's message at the same place, and the aliases are the same: a
//! message replaced (a compaction's summary, a retracted send) or another tool set renders
//! whole again. Messages with media are never held (their bytes depend on what the request
//! loaded), and neither is anything after them.
//!
//! Entries live per thread (a shard renders its own sessions' requests). Each holds weak
//! pointers to its messages, so an address is never reused while an entry names it. The
//! bytes held are bounded ([`BYTES_MAX`] per thread): past it, entries whose session's
//! messages are gone go first, then the least recently used.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

use broca_protocol::{Block, Message, Request};

use crate::json::JsonWriter;
use crate::Aliases;

/// The rendered bytes a thread keeps at most.
pub const BYTES_MAX: usize = 32 * 1024 * 1024;

/// One session's rendered messages in one family.
struct Entry {
    family: &'static str,
    aliases: Aliases,
    /// The messages rendered into `bytes`, in order (those the family leaves out too).
    messages: Vec<Weak<Message>>,
    /// The messages array's contents for them: each kept message's object, comma-separated.
    bytes: Vec<u8>,
    /// Whether a message with media was met: nothing after it is held.
    closed: bool,
    used: u64,
}

#[derive(Default)]
struct Cache {
    entries: RefCell<HashMap<usize, Entry>>,
    bytes: Cell<usize>,
    clock: Cell<u64>,
    /// Messages copied from held prefixes, and messages rendered, by this thread.
    reused: Cell<u64>,
    fresh: Cell<u64>,
}

/// What this thread's held prefixes hold and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Rendered bytes held now.
    pub bytes: usize,
    /// Messages copied from a held prefix instead of rendered.
    pub reused: u64,
    /// Messages rendered.
    pub rendered: u64,
}

thread_local! {
    static CACHE: Cache = Cache::default();
}

/// What this thread's held prefixes hold and did.
pub fn stats() -> PrefixStats {
    CACHE.with(|c| PrefixStats {
        bytes: c.bytes.get(),
        reused: c.reused.get(),
        rendered: c.fresh.get(),
    })
}

/// Drops every prefix this thread holds (a cold render, for tests and benches).
pub fn clear() {
    CACHE.with(|c| {
        c.entries.borrow_mut().clear();
        c.bytes.set(0);
    });
}

/// Drops what this thread holds of a session whose actor closes: each entry keyed by one of
/// its `messages` (a request's first message is one of them, unless a compaction replaced
/// the start). The session's messages may live on elsewhere (the store's thread shares them),
/// so the bound's sweep of sessions whose messages are gone would not find it.
pub fn forget(messages: &[Arc<Message>]) {
    CACHE.with(|c| {
        if c.entries.borrow().is_empty() {
            return;
        }
        for m in messages {
            c.take(Arc::as_ptr(m) as usize);
        }
    });
}

/// Whether a message's rendering depends on more than the message (its media's bytes).
fn has_media(m: &Message) -> bool {
    m.content.iter().any(|b| matches!(b, Block::Media(_)))
}

/// Writes the members of a messages array: the session's held prefix, then each message
/// it does not cover, written by `one` (given the message's index; it writes nothing for a
/// message the family leaves out). The messages before `limit` are held for the next
/// request: a family gives the index of a message whose rendering is not final (the last,
/// with its cache breakpoint), or the count of messages.
pub(crate) fn messages<'a>(
    w: &mut JsonWriter,
    family: &'static str,
    req: &'a Request,
    aliases: &Aliases,
    limit: usize,
    mut one: impl FnMut(&mut JsonWriter, usize, &'a Arc<Message>),
) {
    let mut prefix = Prefix::take(family, req, aliases, limit);
    if prefix.covered == 0 {
        // Held from the first message on: about the request's size, in one allocation.
        prefix.entry.bytes.reserve(crate::size_hint(req));
        prefix.entry.messages.reserve(limit);
    }
    w.members(prefix.bytes());
    for (i, m) in req.messages.iter().enumerate().skip(prefix.covered()) {
        let at = w.len();
        one(w, i, m);
        if i < limit {
            prefix.rendered(m, w.since(at));
        }
    }
    debug_assert!(
        prefix.entry.closed || prefix.entry.messages.len() == limit.min(req.messages.len()),
        "an open prefix holds every message before the limit"
    );
    prefix.keep();
}

/// A request's messages array being rendered with its session's held prefix.
struct Prefix {
    family: &'static str,
    key: Option<usize>,
    entry: Entry,
    /// Messages of the request the held bytes cover.
    covered: usize,
}

impl Prefix {
    /// The held prefix of `req`'s session in `family`, when it still fits the request: the
    /// messages it covers (at most `limit`: the ones before the last kept) are the request's
    /// own, by pointer, under the same aliases. Otherwise an empty one, to be grown.
    fn take(family: &'static str, req: &Request, aliases: &Aliases, limit: usize) -> Prefix {
        let key = req.messages.first().map(|m| Arc::as_ptr(m) as usize);
        let held = key.and_then(|k| CACHE.with(|c| c.take(k)));
        let fits = |e: &Entry| {
            e.family == family
                && e.aliases == *aliases
                && e.messages.len() <= limit
                && e.messages
                    .iter()
                    .zip(&req.messages)
                    .all(|(w, m)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(m)))
        };
        let entry = match held {
            Some(e) if fits(&e) => e,
            _ => Entry {
                family,
                aliases: aliases.clone(),
                messages: Vec::new(),
                bytes: Vec::new(),
                closed: false,
                used: 0,
            },
        };
        let covered = entry.messages.len();
        debug_assert!(
            covered <= limit.min(req.messages.len()),
            "a held prefix covers only the request's own messages before the limit"
        );
        CACHE.with(|c| {
            c.reused.set(c.reused.get() + covered as u64);
            c.fresh
                .set(c.fresh.get() + (req.messages.len() - covered) as u64);
        });
        Prefix {
            family,
            key,
            covered,
            entry,
        }
    }

    /// How many of the request's messages the held bytes cover (render from there on).
    fn covered(&self) -> usize {
        self.covered
    }

    /// The held bytes: the messages array's contents for the covered messages.
    fn bytes(&self) -> &[u8] {
        &self.entry.bytes
    }

    /// Message `m` (the request's next, in order) was rendered as `rendered` (the array's
    /// bytes it added: its comma and object, or nothing when the family leaves it out). It
    /// is held unless it, or one before it, has media.
    fn rendered(&mut self, m: &Arc<Message>, rendered: &[u8]) {
        self.entry.closed |= has_media(m);
        if self.entry.closed {
            return;
        }

        self.entry.messages.push(Arc::downgrade(m));
        // The held bytes begin with a member, not the comma before it (members written before
        // them, a system message, come first): `JsonWriter::members` writes that comma.
        let rendered = match rendered {
            [b',', rest @ ..] if self.entry.bytes.is_empty() => rest,
            all => all,
        };
        self.entry.bytes.extend_from_slice(rendered);
    }

    /// Keeps the grown prefix for the session's next request.
    fn keep(self) {
        let Some(key) = self.key else { return };
        if self.entry.messages.is_empty() {
            return;
        }
        assert_eq!(self.entry.family, self.family);
        CACHE.with(|c| c.put(key, self.entry));
    }
}

impl Cache {
    fn take(&self, key: usize) -> Option<Entry> {
        let e = self.entries.borrow_mut().remove(&key)?;
        self.bytes.set(self.bytes.get() - e.bytes.len());
        Some(e)
    }

    fn put(&self, key: usize, mut e: Entry) {
        let now = self.clock.get() + 1;
        self.clock.set(now);
        e.used = now;
        let len = e.bytes.len();
        if len > BYTES_MAX / 4 {
            return; // one session's conversation does not crowd out every other
        }
        if self.bytes.get() + len > BYTES_MAX {
            self.make_room(len);
        }
        self.bytes.set(self.bytes.get() + len);
        let old = self.entries.borrow_mut().insert(key, e);
        assert!(old.is_none(), "an entry is taken before it is put back");
    }

    /// Drops the entries of sessions whose messages are gone, then the least recently used,
    /// until `len` more bytes fit under [`BYTES_MAX`].
    fn make_room(&self, len: usize) {
        let mut entries = self.entries.borrow_mut();
        entries.retain(|_, e| e.messages.first().is_some_and(|m| m.strong_count() > 0));
        let mut held: usize = entries.values().map(|e| e.bytes.len()).sum();
        if held + len > BYTES_MAX {
            let mut by_use: Vec<(u64, usize)> = entries.iter().map(|(k, e)| (e.used, *k)).collect();
            by_use.sort_unstable();
            for (_, k) in by_use {
                if held + len <= BYTES_MAX {
                    break;
                }
                let e = entries.remove(&k).expect("listed from the map");
                held -= e.bytes.len();
            }
        }
        self.bytes.set(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::anthropic::render::render;
    use broca_protocol::Role;

    fn message(role: Role, content: Vec<Block>) -> Arc<Message> {
        Arc::new(Message { role, content })
    }

    /// A tool-calling conversation of `steps` rounds after a prompt.
    fn conversation(steps: usize) -> Vec<Arc<Message>> {
        let mut m = vec![message(
            Role::User,
            vec![Block::Text {
                text: "Check the weather \"now\"\nplease".into(),
            }],
        )];
        for i in 0..steps {
            m.push(message(
                Role::Assistant,
                vec![
                    Block::Text {
                        text: format!("Step {i}: asking"),
                    },
                    Block::ToolUse {
                        id: format!("call {i}"),
                        name: "weather.get".into(),
                        input: broca_protocol::Json::from_text(r#"{"city":"Paris"}"#.into())
                            .unwrap(),
                    },
                ],
            ));
            m.push(message(
                Role::User,
                vec![Block::ToolResult {
                    tool_use_id: format!("call {i}"),
                    content: format!("{i}8C\twith \u{e9}"),
                    is_error: i % 3 == 0,
                }],
            ));
        }
        m
    }

    fn request(messages: &[Arc<Message>]) -> Request {
        Request {
            messages: messages.to_vec(),
            prompt_cache: true,
            ..crate::sample_request()
        }
    }

    /// Each family that holds prefixes, and whether its last message is rendered afresh at
    /// every request (Anthropic's carries the cache breakpoint).
    type Render = fn(&Request, &Aliases) -> crate::Rendered;
    const FAMILIES: [(&str, Render, bool); 3] = [
        ("anthropic", render, true),
        ("openai_chat", crate::openai_chat::render::render, false),
        (
            "openai_responses",
            crate::openai_responses::render::render,
            false,
        ),
    ];

    /// The request's bytes rendered by `render` with nothing held.
    fn cold_with(render: Render, req: &Request, aliases: &Aliases) -> Vec<u8> {
        let held = CACHE.with(|c| std::mem::take(&mut *c.entries.borrow_mut()));
        let bytes = CACHE.with(|c| c.bytes.replace(0));
        let body = render(req, aliases).body;
        CACHE.with(|c| {
            *c.entries.borrow_mut() = held;
            c.bytes.set(bytes);
        });
        body
    }

    #[test]
    fn a_growing_conversation_renders_the_same_bytes_from_its_held_prefix() {
        for (family, render, last_afresh) in FAMILIES {
            clear();
            let all = conversation(12);
            let req = request(&all[..1]);
            let aliases = Aliases::for_tools(&req.tools);
            for n in 1..=all.len() {
                let req = request(&all[..n]);
                let before = stats();
                let warm = render(&req, &aliases).body;
                let after = stats();
                assert_eq!(warm, cold_with(render, &req, &aliases), "{family}: {n}");
                // Every message the previous request held came from its prefix.
                let expect_reused = n.saturating_sub(if last_afresh { 2 } else { 1 }) as u64;
                let reused = after.reused - before.reused;
                assert_eq!(reused, expect_reused, "{family}: {n} messages");
                assert_eq!(after.rendered - before.rendered, n as u64 - expect_reused);
            }
            assert!(stats().bytes > 0);
            // The same request again (a retried step) reuses what it held.
            let req = request(&all);
            let before = stats();
            let warm = render(&req, &aliases).body;
            let expect = all.len() as u64 - u64::from(last_afresh);
            assert_eq!(stats().reused - before.reused, expect, "{family}");
            assert_eq!(warm, cold_with(render, &req, &aliases), "{family}");
        }
    }

    #[test]
    fn a_closed_sessions_prefix_is_dropped_while_its_messages_live_on() {
        clear();
        let (family, render, _) = FAMILIES[0];
        let one = conversation(6);
        let other = conversation(6);
        for all in [&one, &other] {
            let req = request(all);
            render(&req, &Aliases::for_tools(&req.tools));
        }
        let both = stats().bytes;
        assert!(both > 0, "{family}");
        // The first session's actor closes; its messages are still held (the store's thread).
        forget(&one);
        let left = stats().bytes;
        assert!(left > 0 && left < both, "{left} of {both}");
        let req = request(&one);
        let before = stats();
        render(&req, &Aliases::for_tools(&req.tools));
        assert_eq!(stats().reused, before.reused, "it renders whole again");
        let req = request(&other);
        let before = stats();
        render(&req, &Aliases::for_tools(&req.tools));
        assert!(stats().reused > before.reused, "the other keeps its prefix");
    }

    #[test]
    fn a_replaced_message_or_other_aliases_render_whole_again() {
        clear();
        let mut all = conversation(6);
        let req = request(&all);
        let aliases = Aliases::for_tools(&req.tools);
        render(&req, &aliases);
        // A message in the middle replaced (a compaction's summary): nothing is reused.
        all[3] = message(
            Role::User,
            vec![Block::Text {
                text: "summary".into(),
            }],
        );
        all.push(message(
            Role::Assistant,
            vec![Block::Text { text: "ok".into() }],
        ));
        let req = request(&all);
        let before = stats();
        assert_eq!(
            render(&req, &aliases).body,
            cold_with(render, &req, &aliases)
        );
        assert_eq!(stats().reused, before.reused, "nothing held fits");
        // Another tool set (other aliases) for the same messages: nothing is reused either.
        let mut other = req.clone();
        let mut tools = other.tools.to_vec();
        tools[0].name = "weather get".into();
        other.tools = tools.into();
        let other_aliases = Aliases::for_tools(&other.tools);
        let before = stats();
        assert_eq!(
            render(&other, &other_aliases).body,
            cold_with(render, &other, &other_aliases)
        );
        assert_eq!(stats().reused, before.reused);
    }

    #[test]
    fn nothing_from_a_message_with_media_on_is_held() {
        clear();
        let mut all = conversation(2);
        all.insert(
            2,
            message(
                Role::User,
                vec![Block::Media(broca_protocol::media::Media {
                    kind: "image".into(),
                    mime: "image/png".into(),
                    bytes: 3,
                    sha256: "ab".repeat(32),
                })],
            ),
        );
        all.push(message(
            Role::Assistant,
            vec![Block::Text {
                text: "done".into(),
            }],
        ));
        let req = request(&all);
        let aliases = Aliases::for_tools(&req.tools);
        render(&req, &aliases);
        let before = stats();
        let warm = render(&req, &aliases).body;
        assert_eq!(
            stats().reused - before.reused,
            2,
            "only the messages before the media"
        );
        assert_eq!(warm, cold_with(render, &req, &aliases));
    }

    #[test]
    fn past_the_bound_the_least_recently_used_sessions_go() {
        let c = Cache::default();
        let first = conversation(0);
        let entry = |n: usize| Entry {
            family: "anthropic",
            aliases: Aliases::default(),
            messages: vec![Arc::downgrade(&first[0])],
            bytes: vec![b'x'; n],
            closed: false,
            used: 0,
        };
        c.put(1, entry(BYTES_MAX / 4));
        c.put(2, entry(BYTES_MAX / 4));
        c.put(3, entry(BYTES_MAX / 4));
        c.put(4, entry(BYTES_MAX / 4));
        assert_eq!(c.bytes.get(), BYTES_MAX);
        c.put(5, entry(10));
        assert!(c.take(1).is_none(), "the least recently used went");
        assert!(c.take(2).is_some());
        assert_eq!(c.bytes.get(), 2 * (BYTES_MAX / 4) + 10);
        // An entry whose session's messages are gone goes before any live one.
        let gone = conversation(0);
        c.put(
            6,
            Entry {
                messages: vec![Arc::downgrade(&gone[0])],
                ..entry(BYTES_MAX / 4)
            },
        );
        drop(gone);
        c.put(7, entry(BYTES_MAX / 4));
        let held = |k: usize| c.entries.borrow().contains_key(&k);
        assert!(
            !held(6) && held(3),
            "the gone session's entry went, not the oldest live one"
        );
        c.put(8, entry(BYTES_MAX / 4));
        assert!(
            !held(3) && held(4) && held(8),
            "then the least recently used"
        );
        // One session's conversation past a quarter of the bound is not held at all.
        c.put(9, entry(BYTES_MAX / 4 + 1));
        assert!(c.take(9).is_none());
    }
}

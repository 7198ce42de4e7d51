//! A progress bar for the long commands (`store rebuild`, `wal verify`, `archive pack`): on
//! stderr, only when stderr is a terminal (quiet otherwise: a script or a log gets the
//! command's own lines and nothing else), redrawn at most ten times a second, and cleared
//! before anything else is printed and at the end.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// How often the bar is drawn again, at most.
const REDRAW: Duration = Duration::from_millis(100);
/// The bar's width, in cells.
const WIDTH: u64 = 30;

/// Items done of a known total.
pub(crate) struct Count {
    what: &'static str,
    total: u64,
    done: u64,
    on: bool,
    drawn: Option<Instant>,
}

impl Count {
    /// A bar of `total` items (`what`: how they are counted, e.g. "WALs verified"); off when
    /// stderr is not a terminal or there is at most one item.
    pub(crate) fn new(what: &'static str, total: u64) -> Count {
        Count {
            what,
            total,
            done: 0,
            on: total > 1 && std::io::stderr().is_terminal(),
            drawn: None,
        }
    }

    /// `done` items are done.
    pub(crate) fn set(&mut self, done: u64) {
        self.done = done.min(self.total);
        let due = self.drawn.is_none_or(|t| t.elapsed() >= REDRAW) || self.done == self.total;
        if self.on && due {
            self.draw();
        }
    }

    /// One more item is done.
    pub(crate) fn tick(&mut self) {
        self.set(self.done + 1);
    }

    /// Clears the bar (before a line of the command's own, or at the end); the next `set`
    /// draws it again.
    pub(crate) fn clear(&mut self) {
        if self.on && self.drawn.is_some() {
            let _ = std::io::stderr().write_all(b"\r\x1b[2K");
            self.drawn = None;
        }
    }

    fn draw(&mut self) {
        let filled = (self.done * WIDTH).checked_div(self.total).unwrap_or(WIDTH) as usize;
        let line = format!(
            "\r[{}{}] {}/{} {}",
            "#".repeat(filled),
            " ".repeat(WIDTH as usize - filled),
            self.done,
            self.total,
            self.what
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
        self.drawn = Some(Instant::now());
    }
}

impl Drop for Count {
    fn drop(&mut self) {
        self.clear();
    }
}

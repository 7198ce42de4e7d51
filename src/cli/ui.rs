//! `broca ui`: a one-time sign-in link to the running serve's web view (`/ui`). The link is
//! asked of serve with the handle (or on its owner-only socket); opening it signs the browser
//! in with a cookie and spends the link, so the handle never reaches the browser.

use super::client::{ClientError, Daemon};
use super::{EXIT_FAILURE, EXIT_OK};

pub(super) const UI_HELP: &str = "\
Usage: broca ui [--json] [--connect URL|SOCKET]

Prints a one-time link that signs a browser in to the running serve's read-only web view
(/ui): sessions and runs with their states and usage, transcripts with their tool calls, and a
live view of a session. The link works once and for 2 minutes; the browser then stays signed
in (an HttpOnly cookie) until serve restarts, for at most 12 hours. The view can read, not
send or cancel. --json prints {\"url\", \"expires_in_s\"}.
";

pub(super) fn ui(daemon: &Daemon, json: bool, pargs: pico_args::Arguments) -> Result<u8, String> {
    let rest = super::rest(pargs)?;
    if !rest.is_empty() {
        return Err("`broca ui` takes no positional argument".into());
    }
    match daemon.post("/ui/link", "{}") {
        Ok(link) if json => {
            broca_io::outln!("{link}");
            Ok(EXIT_OK)
        }
        Ok(link) => {
            let url = link["url"].as_str().unwrap_or_default();
            broca_io::outln!("{url}");
            broca_io::errln!(
                "Open this link in a browser on this machine within {} s; it signs in once.",
                link["expires_in_s"].as_u64().unwrap_or(0)
            );
            Ok(EXIT_OK)
        }
        Err(ClientError::Refused { code, message }) => {
            broca_io::errln!("broca: {daemon} refused a sign-in link: {code}: {message}");
            Ok(EXIT_FAILURE)
        }
        Err(e) => {
            broca_io::errln!("broca: {e}");
            Ok(EXIT_FAILURE)
        }
    }
}

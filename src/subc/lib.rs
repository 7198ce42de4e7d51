//! broca's side of the subconscious daemon's wire (subc v2), built on the ecosystem's own
//! crates: `subc-protocol` for the envelope, the frame types and every channel-0 body,
//! `subc-transport` for the connection file and the handshake's proofs. Their I/O is tokio's;
//! broca's shards run on glommio, so the bytes are moved here: the handshake and HELLO over a
//! blocking socket before the shards start (`connect`), and the frame stream by a sans-IO
//! decoder (`frames`) that the shard feeds from its own socket. The claustrum vault is reached
//! over a route of its own (`vault`), read with `cortexkit-claustrum-client`'s decoders.
//! Tools of the daemon's tool_provider modules go over a shared consumer connection (`link`,
//! two threads of its own) with the role's bodies (`toolprov`).
//!
//! Where things are: the subconscious daemon's wire on the ecosystem's crates: connection file,
//! handshake and HELLO, frames, a blocking client of a module's management surface
//! (`surface.rs`) under the vault client and ckbus's, the bus publisher (`bus.rs`: NATS on a
//! thread of its own, credentials and nonce signatures from ckbus), the consumer link shared by
//! every shard, the `tool-provider/v1` bodies (docs/module.md; a `tool-result/v1` answer of a
//! tool that opts in read in parts, its images decoded)

pub mod bus;
pub mod connect;
pub mod frames;
pub mod link;
pub mod manifest;
pub mod negotiated;
pub mod scope;
pub mod surface;
pub mod toolprov;
pub mod vault;

pub use cortexkit_claustrum_client as claustrum;
pub use subc_protocol as protocol;
pub use subc_transport as transport;

/// Why a frame, a request or an answer on the daemon's wire failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkError {
    /// The connection could not be made, or is down: how.
    Down(String),
    /// A frame the wire's rules refuse, or a body that does not decode: what.
    Protocol(String),
    /// The daemon or a module refused: what it said.
    Refused(String),
}

impl std::fmt::Display for LinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LinkError::Down(e) | LinkError::Protocol(e) | LinkError::Refused(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for LinkError {}

impl From<LinkError> for String {
    fn from(e: LinkError) -> String {
        e.to_string()
    }
}

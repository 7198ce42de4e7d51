//! broca's side of the subconscious daemon's wire (subc v2), built on the ecosystem's own
//! crates: `subc-protocol` for the envelope, the frame types and every channel-0 body,
//! `subc-transport` for the connection file and the handshake's proofs. Their I/O is tokio's;
//! broca's shards run on glommio, so the bytes are moved here: the handshake and HELLO over a
//! blocking socket before the shards start (`connect`), and the frame stream by a sans-IO
//! decoder (`frames`) that the shard feeds from its own socket. The claustrum vault is reached
//! over a route of its own (`vault`), read with `cortexkit-claustrum-client`'s decoders.
//! Tools of the daemon's tool_provider modules go over a shared consumer connection (`link`,
//! two threads of its own) with the role's bodies (`toolprov`).

pub mod connect;
pub mod frames;
pub mod link;
pub mod manifest;
pub mod toolprov;
pub mod vault;

pub use cortexkit_claustrum_client as claustrum;
pub use subc_protocol as protocol;
pub use subc_transport as transport;

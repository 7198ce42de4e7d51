//! What each shard owns once, shared by everything that runs on it: the group-commit
//! scheduler of its logs and the HTTP client whose keep-alive pools its model calls use.

use std::rc::Rc;

use broca_io::net::{ClientConfig, HttpClient};
use broca_io::Committer;

/// One shard's services.
pub struct Services {
    /// The shard's index.
    pub shard: usize,
    /// The group-commit scheduler every log of the shard flushes through.
    pub committer: Committer,
    /// The shard's HTTP client (its pools per origin).
    pub http: Rc<HttpClient>,
}

impl Services {
    /// Shard `shard`'s services, its HTTP client configured by `client`.
    pub fn new(shard: usize, client: ClientConfig) -> Services {
        Services {
            shard,
            committer: Committer::default(),
            http: HttpClient::new(client),
        }
    }
}

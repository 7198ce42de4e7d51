//! broca-ck: the compaction contract's side of a session whose plan names a compaction
//! provider (the brief's prompt-reduction transforms; docs/compaction-providers.md), sans-IO:
//! the transcript in the contract's neutral part model with its tag numbers and
//! `session.entries` pages (`neutral`), a provider's view checked and a request rendered
//! through it, the plan's provider and the numbers a request shows (`provided`).

pub mod neutral;
pub mod provided;

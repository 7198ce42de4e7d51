//! What broca tells the daemon it is: the HELLO body with its manifest (subc-protocol's
//! types). broca provides one management surface, session-scoped: the management methods,
//! the same ones serve's `/v1/rpc` answers.

use cortexkit_role_llm_runner::ops;
use subc_protocol::manifest::{
    CapabilityDeclarations, CapabilityNeed, CapabilityRequirement, Concurrency, ConsumerRole,
    IdentityScope, ManagementOperation, ManagementOperationKind, ModuleManifest, ProviderRole,
    SelfSignalDeclaration, SelfSignalEffect, SelfSignalKind, SignalAnchor, TrustTier,
};
use subc_protocol::session::MODULE_CONTROL_OP_HEALTH_CHECK;
use subc_protocol::{ModuleHelloBody, PROTOCOL_VERSION};

/// The management methods and whether each changes the session.
pub const OPERATIONS: &[(&str, bool)] = &[
    (ops::SESSION_SEND, true),
    (ops::RUN_STATUS, false),
    (ops::RUN_RESULT, false),
    (ops::RUN_CANCEL, true),
    (ops::SESSION_READ, false),
    (ops::SESSION_HEAD, false),
    (ops::SESSION_RETRACT, true),
    (ops::SESSION_SEND_STATUS, false),
    (ops::SEND_STATUS, false),
    (broca_protocol::ops::SESSION_IMPORT, true),
    (ops::SESSION_SUBSCRIBE, false),
    (ops::ROLE_DESCRIBE, false),
    (ops::SESSION_BASELINE, false),
    (ops::SESSION_RELEASE, true),
    (ops::SESSION_USER_COMMAND, true),
    (ops::SESSION_USER_COMMAND_STATUS, false),
    (ops::SESSION_REFRESH, true),
    (ops::SESSION_REFRESH_POLICY, true),
    (ops::SESSION_FLUSH_PREFIX, true),
    (ops::SESSION_ADOPT, true),
    (broca_protocol::ops::SESSION_HOST_START, true),
];

/// The capabilities broca declares: the bind's scope carries the session's folder
/// (`scope-workdir/v1`), which is the session's project root; and the ecosystem's
/// `llm-runner/v1` role (its required ops, `role.describe` and `session.baseline`, are
/// served; `role.describe` says which of its capability groups are).
pub const CAPABILITIES: &[&str] = &[
    subc_protocol::scope::SCOPE_WORKDIR_CAPABILITY,
    cortexkit_role_llm_runner::PROVIDES,
];

/// The health gauge of the runs in flight: declared busy, so a drain waits for them (a run
/// outlives the request that started it, which is all the daemon sees).
pub const RUNS_GAUGE: &str = "runs_active";

/// What broca reaches over daemon routes: tool_provider modules (the tools config's
/// `modules`), and services (the claustrum vault always; the fusiform catalog module when one
/// is configured).
#[derive(Debug, Clone, Default)]
pub struct Consumes {
    pub tool_modules: Vec<String>,
    pub services: Vec<String>,
}

/// The HELLO body of module `module_id` at `version`, with the daemon's launch nonce when
/// it handed one (never logged: subc-protocol's Debug redacts it).
pub fn hello(
    module_id: &str,
    version: &str,
    launch_nonce: Option<String>,
    consumes: &Consumes,
) -> ModuleHelloBody {
    let mut roles = Vec::new();
    if !consumes.tool_modules.is_empty() {
        roles.push(ConsumerRole::ToolClient {
            of: consumes.tool_modules.clone(),
        });
    }
    if !consumes.services.is_empty() {
        roles.push(ConsumerRole::ServiceClient {
            of: consumes.services.clone(),
        });
    }
    let requires = if consumes.tool_modules.is_empty() {
        Vec::new()
    } else {
        vec![CapabilityRequirement {
            capability: cortexkit_role_tool_provider::PROVIDES.into(),
            need: CapabilityNeed::Optional,
        }]
    };
    let surface = surface();
    // Warming until the host has started (its store, catalog, tools and every shard): the
    // front says ready with `catalog.update` then ([`ready_update`]).
    let manifest: ModuleManifest = ModuleManifest::builder(module_id, version)
        .trust_tier(Some(TrustTier::FirstParty))
        .ready(false)
        .provides(vec![surface])
        .consumes(roles)
        .self_signals(Some(vec![SelfSignalDeclaration {
            name: "model_runs".into(),
            kind: SelfSignalKind::Busy,
            effect: SelfSignalEffect::Observe,
            anchored_to: SignalAnchor::HealthGauges {
                gauges: vec![RUNS_GAUGE.into()],
            },
            cadence: None,
            domain: None,
            note: Some("agent runs in flight; a drain waits for them".into()),
        }]))
        .capabilities(Some(CapabilityDeclarations {
            provides: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
            requires,
            must_never_reach: Vec::new(),
        }))
        .build();
    ModuleHelloBody {
        manifest,
        protocol_ver: PROTOCOL_VERSION,
        control_ops: Some(vec![MODULE_CONTROL_OP_HEALTH_CHECK.to_string()]),
        launch_nonce,
    }
}

/// The management surface broca provides: every operation, by whether it changes anything.
fn surface() -> ProviderRole {
    let operations = OPERATIONS
        .iter()
        .map(|&(name, mutates)| ManagementOperation {
            name: name.to_string(),
            kind: if mutates {
                ManagementOperationKind::Mutate
            } else {
                ManagementOperationKind::Query
            },
            description: None,
        })
        .collect();
    ProviderRole::ManagementSurface {
        operations,
        config_schema: serde_json::json!({"type": "object"}),
        observability: Vec::new(),
        identity_scope: vec![IdentityScope::Session],
        concurrency: Concurrency::ModuleManaged,
    }
}

/// The channel-0 request that says broca is ready for route binds, once the host has started:
/// `catalog.update` with the same roles and `ready: true`.
pub fn ready_update() -> subc_protocol::session::ModuleControlRequestFromModule {
    subc_protocol::session::ModuleControlRequestFromModule::CatalogUpdate {
        provides: vec![surface()],
        capabilities: None,
        ready: Some(true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hello_is_the_golden_one() {
        let consumes = Consumes {
            tool_modules: vec!["ck-shell".into()],
            services: vec!["claustrum".into(), "fusiform".into()],
        };
        let body = hello("ck-broca", "0.1.0", Some("n-123".into()), &consumes);
        let json = serde_json::to_value(&body).unwrap();
        let golden: serde_json::Value =
            serde_json::from_str(include_str!("golden/hello.json")).unwrap();
        assert_eq!(json, golden, "{json}");
        // And the daemon's own types read it back as it was written.
        let back: ModuleHelloBody = serde_json::from_value(json).unwrap();
        assert_eq!(back, body);
        assert!(
            !format!("{body:?}").contains("n-123"),
            "the nonce is never printed"
        );
    }
}

//! A person-only command forwarded to the provider that declared it (tool-provider/v1 §4.2,
//! `user_command.invoke`): the request, and what its terminal frame says. The reply is the
//! provider's `UserCommandReply` (`{state, text, job?}`); none of it is for a model.

use cortexkit_role_tool_provider::ops;
use cortexkit_role_tool_provider::user_command::{UserCommandArguments, UserCommandReply};
use subc_protocol::error_codes::{self, is_established_route_dead};
use subc_protocol::tool_call::ToolCallRequest;
use subc_protocol::FrameType;

use crate::frames::FrameIn;

/// The `user_command.invoke` request of `command` with the person's `input` (verbatim), keyed
/// by the invocation's call key (a provider answers a repeat of the key with its stored
/// reply, never running the command twice).
pub fn invoke_body(command: &str, input: &str, call_key: &str) -> Vec<u8> {
    let arguments = UserCommandArguments {
        command: command.to_string(),
        input: input.to_string(),
    };
    let request = ToolCallRequest {
        name: ops::USER_COMMAND_INVOKE.to_string(),
        arguments: serde_json::to_value(arguments).expect("arguments serialize"),
        tool_call_id: None,
        progress_token: None,
        call_key: Some(call_key.to_string()),
        schema_pin: None,
        preset: None,
        origin: None,
        output_refs: None,
    };
    serde_json::to_vec(&request).expect("a command request serializes")
}

/// What the terminal frame of a forwarded command says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invoked {
    /// The provider's reply.
    Reply(UserCommandReply),
    /// The provider refused the request itself (its code and message): the command did not
    /// run.
    Refused { code: String, message: String },
    /// The daemon says the route was dead before delivery: nothing reached the provider.
    NotDelivered(String),
    /// The provider may have the request, and its reply cannot be read: the command may
    /// have run (why).
    Lost(String),
}

/// Reads the terminal frame of a `user_command.invoke` sent to `module_id`.
pub fn read_invoke(module_id: &str, frame: &FrameIn) -> Invoked {
    match frame.header.ty {
        FrameType::Response => match serde_json::from_slice::<UserCommandReply>(&frame.body) {
            Ok(reply) => match reply.check() {
                Ok(()) => Invoked::Reply(reply),
                Err(e) => Invoked::Lost(format!(
                    "tool module `{module_id}` answered a command reply that does not hold: {}",
                    e.message
                )),
            },
            Err(e) => Invoked::Lost(format!(
                "tool module `{module_id}` answered a body that is not a command reply: {e}"
            )),
        },
        FrameType::Error => {
            let e = super::error_body(&frame.body);
            if is_established_route_dead(frame.header.flags, &e.code)
                || e.code == error_codes::MODULE_RELOADING
            {
                Invoked::NotDelivered(e.code)
            } else if frame.header.flags.is_daemon_origin()
                || super::DAEMON_AFTER_DELIVERY.contains(&e.code.as_str())
            {
                Invoked::Lost(format!(
                    "the daemon ended the command sent to `{module_id}` after delivering it: {}: {}",
                    e.code, e.message
                ))
            } else {
                Invoked::Refused {
                    code: e.code,
                    message: e.message,
                }
            }
        }
        other => Invoked::Lost(format!("a {other:?} frame ended the command")),
    }
}

//! Tool routing (the brief's tools role): the configured MCP servers, the tool specs they
//! offer (each with its route, frozen into RunStarted by admission), and the router that
//! sends a call to the server its route names. One set of servers per broca process, shared
//! by every shard; a router per shard (it uses that shard's HTTP client).
//!
//! The daemon's tool modules (module mode) are reached over daemon routes ([`modules`]);
//! their specs join these with [`ToolServers::with_more`]. A session's run calls both through
//! one [`ToolRunner`] ([`runner`]).
//!
//! Where things are: tool routing: the tools config, MCP servers (stdio, Streamable HTTP), the
//! tool modules over daemon routes (`modules.rs`, calls at most once, a module not up at start
//! asked again while broca serves (broca-host's shard 0) and its tools added to the offered
//! ones, the fusiform catalog's `catalog.get`, a fetch plan's items asked of their modules at
//! once under one deadline in `modules/plan.rs`, a person-only command's `user_command.invoke`
//! in `modules/command.rs`, a compaction provider's ops on the session's `compaction-
//! provider/v2` route, and a step-transform provider's on its `step-transform-provider/v2`
//! route, in `modules/compaction.rs`, its late entries (a call key of `broca-cmd:`) handed by
//! every read to the late sink, which has its session record them before the ack), and
//! `ToolRunner` (`runner.rs`) with its outcomes (an answer in parts, text and images, included;
//! an MCP result's images kept in parts by `result.rs`); a shard's `Tools` runs both

pub mod config;
pub mod late;
pub mod mcp;
pub mod modules;
pub mod result;
pub mod runner;

pub use broca_protocol::schema;
pub use runner::{NoTools, ToolOrigin, ToolOutcome, ToolPart, ToolRunner, Tools};

use std::rc::Rc;
use std::sync::Arc;

use broca_io::net::HttpClient;
use serde_json::Value;

use broca_protocol::{ToolCall, ToolSpec};
use config::{ToolsConfig, Transport};
use mcp::http::HttpServer;
use mcp::stdio::StdioServer;
pub use mcp::McpError;
use mcp::{Answer, CallError};
use result::ToolText;

/// The HTTP client for Streamable HTTP tool servers on one shard: it keeps no idle
/// connections, so a request is never retried on a pooled connection that turned out closed
/// (a tool call is sent at most once).
pub fn tool_http_client(
    tls: Arc<broca_io::net::rustls::ClientConfig>,
    proxy: broca_io::net::proxy::ProxyConfig,
) -> Rc<HttpClient> {
    let mut cfg = broca_io::net::ClientConfig::new(tls, proxy);
    cfg.idle_per_origin = 0;
    HttpClient::new(cfg)
}

/// The route prefix of tools that MCP servers provide.
pub const MCP_ROUTE_PREFIX: &str = broca_protocol::route::MCP_PREFIX;

#[derive(Clone)]
enum Server {
    Stdio(Arc<StdioServer>),
    Http(Arc<HttpServer>),
}

impl Server {
    fn name(&self) -> &str {
        match self {
            Server::Stdio(s) => s.name(),
            Server::Http(s) => s.name(),
        }
    }
}

/// Every configured server, and the tools offered: the servers' as they answered at start,
/// and the tool modules' as each answered (a module up later adds its own then).
pub struct ToolServers {
    servers: Vec<Server>,
    specs: std::sync::RwLock<Arc<[ToolSpec]>>,
    result_bytes_max: usize,
}

/// How starting the servers went: one line per server that could not be started (its tools
/// are not offered).
pub type StartProblems = Vec<String>;

impl ToolServers {
    /// No servers, no tools.
    pub fn none() -> Arc<ToolServers> {
        Arc::new(ToolServers {
            servers: Vec::new(),
            specs: std::sync::RwLock::new(Vec::new().into()),
            result_bytes_max: config::RESULT_BYTES_MAX_DEFAULT,
        })
    }

    /// Starts (or reaches) every configured server and lists its tools, all at once. A server
    /// that fails is reported and left out; the others are kept. Runs on a glommio executor.
    pub async fn start(
        cfg: ToolsConfig,
        http: &Rc<HttpClient>,
    ) -> Result<(Arc<ToolServers>, StartProblems), McpError> {
        let mut servers = Vec::with_capacity(cfg.servers.len());
        for s in cfg.servers {
            servers.push(match &s.transport {
                Transport::Stdio { .. } => Server::Stdio(StdioServer::new(s)),
                Transport::Http { .. } => Server::Http(HttpServer::new(s)?),
            });
        }
        // Every server starts at once: a slow one does not hold up the others.
        let mut lists = Vec::with_capacity(servers.len());
        for server in &servers {
            let (server, http) = (server.clone(), http.clone());
            lists.push(glommio::spawn_local(async move {
                match server {
                    Server::Stdio(s) => s.tools().await,
                    Server::Http(s) => s.tools(&http).await,
                }
            }));
        }
        let mut specs = Vec::new();
        let mut problems = Vec::new();
        for (server, list) in servers.iter().zip(lists) {
            match list.await {
                Ok(tools) => {
                    tracing::info!(
                        server = server.name(),
                        tools = tools.len(),
                        "tool server ready"
                    );
                    specs.extend(tools.into_iter().map(|t| ToolSpec {
                        name: t.name,
                        description: t.description,
                        input_schema: t.input_schema,
                        route: format!("{MCP_ROUTE_PREFIX}{}", server.name()),
                        reply: None,
                    }));
                }
                Err(e) => problems.push(e.to_string()),
            }
        }
        Ok((
            Arc::new(ToolServers {
                servers,
                specs: std::sync::RwLock::new(specs.into()),
                result_bytes_max: cfg.result_bytes_max,
            }),
            problems,
        ))
    }

    /// Offers more tools (a tool module's, routed elsewhere), from the next admission on; a
    /// tool whose name is taken already is left out, with a line saying so.
    pub fn add(&self, more: Vec<ToolSpec>) -> StartProblems {
        let mut offered = self.specs.write().unwrap_or_else(|e| e.into_inner());
        let mut specs = offered.to_vec();
        let mut problems = Vec::new();
        for spec in more {
            if let Some(other) = specs.iter().find(|s| s.name == spec.name) {
                problems.push(format!(
                    "tool `{}` of `{}` has the name of `{}`'s",
                    spec.name, spec.route, other.route
                ));
                continue;
            }
            specs.push(spec);
        }
        *offered = specs.into();
        problems
    }

    /// The tools offered now, each with its route.
    pub fn specs(&self) -> Arc<[ToolSpec]> {
        self.specs.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Stops every server process (stdin closed, then killed after a grace period).
    pub fn stop(&self) {
        for s in &self.servers {
            if let Server::Stdio(s) = s {
                s.stop();
            }
        }
    }

    fn server(&self, route: &str) -> Option<&Server> {
        let name = route.strip_prefix(MCP_ROUTE_PREFIX)?;
        self.servers.iter().find(|s| s.name() == name)
    }
}

/// The router of one shard.
pub struct Router {
    servers: Arc<ToolServers>,
    http: Rc<HttpClient>,
}

impl Router {
    pub fn new(servers: Arc<ToolServers>, http: Rc<HttpClient>) -> Router {
        Router { servers, http }
    }

    /// Sends `call` to the server `route` names. The arguments were checked against the
    /// tool's schema before (see core's dispatch).
    pub async fn call(&self, call: &ToolCall, route: &str) -> Result<ToolText, CallError> {
        let Some(server) = self.servers.server(route) else {
            return Err(CallError::Refused(format!(
                "no tool server for route `{route}` (tool `{}`)",
                call.name
            )));
        };
        let args: Value = serde_json::from_str(call.input.get()).map_err(|e| {
            CallError::Refused(format!(
                "the arguments of `{}` are not JSON: {e}",
                call.name
            ))
        })?;
        let answer = match server {
            Server::Stdio(s) => s.call(&call.name, &args).await?,
            // Boxed: the HTTP call is a large future (the client's exchange inside timeouts),
            // which would otherwise size every tool call's task (BENCHMARKS.md).
            Server::Http(s) => Box::pin(s.call(&self.http, &call.name, &args)).await?,
        };
        let max = self.servers.result_bytes_max;
        Ok(match answer {
            Answer::Result(v) => result::from_call_result(&v, max),
            Answer::Error { code, message } => ToolText {
                content: result::truncate(
                    format!("the tool server answered an error (code {code}): {message}"),
                    max,
                ),
                is_error: true,
                parts: None,
            },
        })
    }
}

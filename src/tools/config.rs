//! The tools config (`--tools-config FILE`, JSON or TOML): the MCP servers broca starts or
//! reaches, with their limits.
//!
//! ```json
//! {"mcp": [{"name": "fs", "command": ["npx", "-y", "@modelcontextprotocol/server-filesystem", "."],
//!           "env": {"KEY": "VALUE"}},
//!          {"name": "search", "url": "http://127.0.0.1:3001/mcp"}],
//!  "modules": [{"module": "ck-shell", "call_timeout_ms": 60000}],
//!  "module_retry_ms": 10000,
//!  "late_poll_ms": 30000,
//!  "result_bytes_max": 102400}
//! ```
//!
//! `modules` names the daemon's tool_provider modules whose tools broca offers beside the MCP
//! servers' (module mode only: they are reached over daemon routes). A module that is not up
//! when broca starts is asked again every `module_retry_ms` (10 s by default) while broca
//! serves, and its tools are offered from the first answer on. The late results of modules
//! that serve them (calls a restart sealed without an outcome, settled since) are read every
//! `late_poll_ms` (30 s by default).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

/// Tool results longer than this are cut, with a marker saying so (by default).
pub const RESULT_BYTES_MAX_DEFAULT: usize = 100 * 1024;
/// How often a tool module that was not up is asked again for its catalog (by default).
pub const MODULE_RETRY_DEFAULT: Duration = Duration::from_secs(10);
/// The shortest `module_retry_ms` taken.
const MODULE_RETRY_MIN_MS: u64 = 100;
/// How often the late results of tool modules that serve them are read (by default).
pub const LATE_POLL_DEFAULT: Duration = Duration::from_secs(30);

/// The whole tools config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsConfig {
    pub servers: Vec<ServerConfig>,
    /// The daemon's tool_provider modules whose tools are offered (module mode).
    pub modules: Vec<ModuleConfig>,
    /// How often a tool module that was not up is asked again for its catalog.
    pub module_retry: Duration,
    /// How often the late results of tool modules that serve them are read.
    pub late_poll: Duration,
    /// Tool results longer than this many bytes are truncated with an explicit marker.
    pub result_bytes_max: usize,
}

impl Default for ToolsConfig {
    fn default() -> Self {
        ToolsConfig {
            servers: Vec::new(),
            modules: Vec::new(),
            module_retry: MODULE_RETRY_DEFAULT,
            late_poll: LATE_POLL_DEFAULT,
            result_bytes_max: RESULT_BYTES_MAX_DEFAULT,
        }
    }
}

/// One tool_provider module of the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleConfig {
    /// Its module id.
    pub module: String,
    /// How long one call may take once delivered; past it the call is indeterminate (and
    /// cancelled).
    pub call_timeout: Duration,
}

/// How broca reaches one MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// A process broca starts, speaking JSON-RPC over its stdin and stdout.
    Stdio {
        command: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<String>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        url: String,
        /// Extra request headers (for example an Authorization header); never logged.
        headers: BTreeMap<String, String>,
    },
}

/// One configured MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    pub name: String,
    pub transport: Transport,
    /// How long starting (spawn, initialize, tools/list) may take.
    pub startup_timeout: Duration,
    /// How long one tool call may take once delivered; past it the call is indeterminate.
    pub call_timeout: Duration,
    /// Calls in flight to this server at once (more wait their turn).
    pub max_concurrency: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    mcp: Vec<FileServer>,
    #[serde(default)]
    modules: Vec<FileModule>,
    module_retry_ms: Option<u64>,
    late_poll_ms: Option<u64>,
    result_bytes_max: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileModule {
    module: String,
    call_timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileServer {
    name: String,
    command: Option<Vec<String>>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    startup_timeout_ms: Option<u64>,
    call_timeout_ms: Option<u64>,
    max_concurrency: Option<usize>,
}

impl ToolsConfig {
    /// Reads and checks the config at `path`: TOML when the name ends in `.toml`, JSON
    /// otherwise. Errors name the file and what is wrong.
    pub fn load(path: &Path) -> Result<ToolsConfig, ConfigError> {
        let in_file = |e: ConfigError| ConfigError {
            file: Some(path.to_path_buf()),
            ..e
        };
        let text =
            std::fs::read_to_string(path).map_err(|e| in_file(ConfigError::new(e.to_string())))?;
        let toml = path.extension().is_some_and(|e| e == "toml");
        ToolsConfig::parse(&text, toml).map_err(in_file)
    }

    /// Parses a config's text.
    pub fn parse(text: &str, toml: bool) -> Result<ToolsConfig, ConfigError> {
        let file: FileConfig = if toml {
            toml::from_str(text).map_err(|e| ConfigError::new(e.message()))?
        } else {
            serde_json::from_str(text).map_err(|e| ConfigError::new(e.to_string()))?
        };
        let mut servers: Vec<ServerConfig> = Vec::with_capacity(file.mcp.len());
        for s in file.mcp {
            let server = server(s)?;
            if servers.iter().any(|o| o.name == server.name) {
                return Err(ConfigError::new(format!(
                    "two servers are named `{}`",
                    server.name
                )));
            }
            servers.push(server);
        }
        let mut modules: Vec<ModuleConfig> = Vec::with_capacity(file.modules.len());
        for m in file.modules {
            let module = m.module.trim().to_string();
            if module.is_empty()
                || !module
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(ConfigError::new(format!(
                    "module `{}`: a module id is letters, digits, `-`, `_` and `.`",
                    m.module
                )));
            }
            if modules.iter().any(|o| o.module == module) {
                return Err(ConfigError::new(format!(
                    "module `{module}` is listed twice"
                )));
            }
            modules.push(ModuleConfig {
                module,
                call_timeout: Duration::from_millis(m.call_timeout_ms.unwrap_or(300_000)),
            });
        }
        let result_bytes_max = file.result_bytes_max.unwrap_or(RESULT_BYTES_MAX_DEFAULT);
        if result_bytes_max < 64 {
            return Err(ConfigError::new("result_bytes_max must be at least 64"));
        }
        let module_retry_ms = file
            .module_retry_ms
            .unwrap_or(MODULE_RETRY_DEFAULT.as_millis() as u64);
        if module_retry_ms < MODULE_RETRY_MIN_MS {
            return Err(ConfigError::new(format!(
                "module_retry_ms must be at least {MODULE_RETRY_MIN_MS}"
            )));
        }
        let late_poll_ms = file
            .late_poll_ms
            .unwrap_or(LATE_POLL_DEFAULT.as_millis() as u64);
        if late_poll_ms < MODULE_RETRY_MIN_MS {
            return Err(ConfigError::new(format!(
                "late_poll_ms must be at least {MODULE_RETRY_MIN_MS}"
            )));
        }
        Ok(ToolsConfig {
            servers,
            modules,
            module_retry: Duration::from_millis(module_retry_ms),
            late_poll: Duration::from_millis(late_poll_ms),
            result_bytes_max,
        })
    }
}

/// One MCP server of the file, checked: a name, and a command or a url with what applies to
/// it.
fn server(s: FileServer) -> Result<ServerConfig, ConfigError> {
    let name = s.name.trim().to_string();
    if name.is_empty() || name.contains(['/', '\n']) {
        return Err(ConfigError::new(format!(
            "server name `{}` must be non-empty, without `/`",
            s.name
        )));
    }
    if s.command.is_some() && !s.headers.is_empty() {
        return Err(ConfigError::new(format!(
            "server `{name}`: `headers` apply to a url, not a command"
        )));
    }
    let transport = match (s.command, s.url) {
        (Some(command), None) => {
            if command.first().is_none_or(|c| c.is_empty()) {
                return Err(ConfigError::new(format!(
                    "server `{name}`: `command` is empty"
                )));
            }
            Transport::Stdio {
                command,
                env: s.env,
                cwd: s.cwd,
            }
        }
        (None, Some(url)) => {
            if !s.env.is_empty() || s.cwd.is_some() {
                return Err(ConfigError::new(format!(
                    "server `{name}`: `env` and `cwd` apply to a command, not a url"
                )));
            }
            Transport::Http {
                url,
                headers: s.headers,
            }
        }
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(format!(
                "server `{name}`: give `command` or `url`, not both"
            )))
        }
        (None, None) => {
            return Err(ConfigError::new(format!(
                "server `{name}`: give `command` or `url`"
            )))
        }
    };
    let max_concurrency = s.max_concurrency.unwrap_or(16);
    if max_concurrency == 0 {
        return Err(ConfigError::new(format!(
            "server `{name}`: max_concurrency must be at least 1"
        )));
    }
    Ok(ServerConfig {
        name,
        transport,
        startup_timeout: Duration::from_millis(s.startup_timeout_ms.unwrap_or(30_000)),
        call_timeout: Duration::from_millis(s.call_timeout_ms.unwrap_or(300_000)),
        max_concurrency,
    })
}

/// A tools config that cannot be used: the file (when one was read) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: Option<std::path::PathBuf>,
    pub problem: String,
}

impl ConfigError {
    fn new(problem: impl Into<String>) -> ConfigError {
        ConfigError {
            file: None,
            problem: problem.into(),
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.file {
            Some(path) => write!(f, "tools config {}: {}", path.display(), self.problem),
            None => f.write_str(&self.problem),
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for String {
    fn from(e: ConfigError) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_toml_give_the_same_config() {
        let json = r#"{"mcp": [{"name": "fs", "command": ["npx", "-y", "srv", "."], "env": {"K": "V"},
                                "call_timeout_ms": 5000},
                               {"name": "web", "url": "http://127.0.0.1:3001/mcp",
                                "headers": {"Authorization": "Bearer x"}}],
                       "modules": [{"module": "ck-shell", "call_timeout_ms": 60000}],
                       "result_bytes_max": 4096}"#;
        let toml = r#"
result_bytes_max = 4096

[[mcp]]
name = "fs"
command = ["npx", "-y", "srv", "."]
env = { K = "V" }
call_timeout_ms = 5000

[[modules]]
module = "ck-shell"
call_timeout_ms = 60000

[[mcp]]
name = "web"
url = "http://127.0.0.1:3001/mcp"
headers = { Authorization = "Bearer x" }
"#;
        let a = ToolsConfig::parse(json, false).unwrap();
        let b = ToolsConfig::parse(toml, true).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.servers.len(), 2);
        assert_eq!(a.servers[0].call_timeout, Duration::from_secs(5));
        assert_eq!(a.servers[1].max_concurrency, 16);
        assert_eq!(a.result_bytes_max, 4096);
        assert_eq!(a.modules[0].module, "ck-shell");
        assert_eq!(a.modules[0].call_timeout, Duration::from_secs(60));
        assert_eq!(a.module_retry, MODULE_RETRY_DEFAULT);
        let quick = ToolsConfig::parse(r#"{"module_retry_ms": 250}"#, false).unwrap();
        assert_eq!(quick.module_retry, Duration::from_millis(250));
        assert_eq!(a.late_poll, LATE_POLL_DEFAULT);
        let late = ToolsConfig::parse(r#"{"late_poll_ms": 300}"#, false).unwrap();
        assert_eq!(late.late_poll, Duration::from_millis(300));
    }

    #[test]
    fn bad_configs_say_what_is_wrong() {
        for (text, want) in [
            (r#"{"mcp": [{"name": "a"}]}"#, "give `command` or `url`"),
            (
                r#"{"mcp": [{"name": "a", "command": ["x"], "url": "http://h"}]}"#,
                "not both",
            ),
            (
                r#"{"mcp": [{"name": "a", "command": []}]}"#,
                "`command` is empty",
            ),
            (
                r#"{"mcp": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]}"#,
                "two servers are named `a`",
            ),
            (
                r#"{"mcp": [{"name": "a", "command": ["x"], "bogus": 1}]}"#,
                "bogus",
            ),
            (
                r#"{"module_retry_ms": 5}"#,
                "module_retry_ms must be at least 100",
            ),
            (
                r#"{"late_poll_ms": 0}"#,
                "late_poll_ms must be at least 100",
            ),
            (
                r#"{"mcp": [{"name": "a", "url": "http://h", "env": {"K": "V"}}]}"#,
                "apply to a command",
            ),
            (r#"{"mcp": [], "result_bytes_max": 3}"#, "at least 64"),
            (r#"{"modules": [{"module": "a b"}]}"#, "a module id is"),
            (
                r#"{"modules": [{"module": "a"}, {"module": "a"}]}"#,
                "listed twice",
            ),
            ("{not json", "key must be a string"),
        ] {
            let err = ToolsConfig::parse(text, false).unwrap_err();
            assert_eq!(err.file, None, "parsed text names no file");
            assert!(err.problem.contains(want), "{text}: {err}");
        }
    }
}

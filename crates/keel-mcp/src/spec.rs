//! What Keel needs to know of one MCP server: how to reach it, which of its tools an agent
//! gets, and how their flags are set.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

/// How long a call waits for its result unless the server's spec says otherwise.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long starting a server (spawning it, or connecting, and the MCP handshake) may take
/// unless its spec says otherwise. Generous: `npx` may download the server first.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(60);

/// One MCP server.
#[derive(Clone)]
pub struct ServerSpec {
    /// Its name: the prefix of its tools' names (`{name}_{tool}`) and of their capabilities.
    pub name: String,
    /// How to reach it.
    pub transport: TransportSpec,
    /// How the server is shown in messages (its command line or URL), secrets masked: the
    /// caller builds it, since only the caller knows which parts are secret.
    pub shown: String,
    /// When not empty, only these tools (by their MCP names) are offered.
    pub allow: Vec<String>,
    /// These tools (by their MCP names) are never offered.
    pub deny: Vec<String>,
    /// How long one call may take.
    pub call_timeout: Duration,
    /// How long starting the server may take.
    pub startup_timeout: Duration,
    /// Flags set by the file over the server's annotations, by MCP tool name.
    pub overrides: HashMap<String, FlagOverrides>,
    /// Capabilities every call to one of its tools needs, besides those Keel derives.
    pub capabilities: Vec<String>,
}

impl ServerSpec {
    /// A server named `name` reached through `transport`, every tool offered, default
    /// timeouts; `shown` is the masked command line or URL.
    pub fn new(
        name: impl Into<String>,
        transport: TransportSpec,
        shown: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            transport,
            shown: shown.into(),
            allow: Vec::new(),
            deny: Vec::new(),
            call_timeout: DEFAULT_CALL_TIMEOUT,
            startup_timeout: DEFAULT_STARTUP_TIMEOUT,
            overrides: HashMap::new(),
            capabilities: Vec::new(),
        }
    }

    /// Whether the allow and deny lists let the tool `name` through.
    pub fn offers(&self, name: &str) -> bool {
        (self.allow.is_empty() || self.allow.iter().any(|a| a == name))
            && !self.deny.iter().any(|d| d == name)
    }
}

/// How a server is reached.
#[derive(Clone)]
pub enum TransportSpec {
    /// A child process spoken to over its stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Environment variables set for it (on top of Keel's own environment).
        env: Vec<(String, String)>,
        /// Its working directory (default: Keel's).
        cwd: Option<PathBuf>,
    },
    /// A streamable HTTP endpoint.
    Http {
        /// The endpoint's URL.
        url: String,
        /// Headers sent with every request (`Authorization: Bearer …`).
        headers: Vec<Header>,
    },
}

/// A request header; a secret one is marked sensitive, so the HTTP stack never logs it.
#[derive(Clone)]
pub struct Header {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: String,
    /// Whether the value is a secret.
    pub secret: bool,
}

/// The flags of one tool, as the file sets them over the server's annotations; `None`
/// keeps what the annotations say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlagOverrides {
    /// The tool changes nothing.
    pub read_only: Option<bool>,
    /// The tool may destroy or overwrite data.
    pub destructive: Option<bool>,
    /// Calling it twice with the same arguments is harmless.
    pub idempotent: Option<bool>,
}

/// What Keel treats an MCP tool as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolFlags {
    /// It changes nothing (capability `mcp.read`, else `mcp.write`).
    pub read_only: bool,
    /// It may destroy or overwrite data (capability `mcp.destructive`).
    pub destructive: bool,
    /// Running it twice is harmless: after a crash its interrupted call is run again, and a
    /// call cut off by a server that stopped is retried once on the restarted server.
    pub idempotent: bool,
}

impl ToolFlags {
    /// The flags from a tool's annotations, with MCP's defaults for what they leave out (not
    /// read-only; destructive unless read-only; not idempotent unless read-only), then the
    /// file's overrides.
    pub fn from_hints(
        read_only: Option<bool>,
        destructive: Option<bool>,
        idempotent: Option<bool>,
        overrides: Option<&FlagOverrides>,
    ) -> Self {
        let none = FlagOverrides::default();
        let overrides = overrides.unwrap_or(&none);
        let read_only = overrides.read_only.or(read_only).unwrap_or(false);
        // MCP: `destructiveHint` and `idempotentHint` are meaningful only for a tool that is
        // not read-only; a read-only tool destroys nothing and may run twice.
        let destructive = overrides
            .destructive
            .unwrap_or(!read_only && destructive.unwrap_or(true));
        let idempotent = overrides
            .idempotent
            .unwrap_or(read_only || idempotent.unwrap_or(false));
        Self {
            read_only,
            destructive,
            idempotent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_hints_take_the_mcp_defaults() {
        let bare = ToolFlags::from_hints(None, None, None, None);
        assert_eq!(
            bare,
            ToolFlags {
                read_only: false,
                destructive: true,
                idempotent: false
            }
        );
        let reader = ToolFlags::from_hints(Some(true), Some(true), Some(false), None);
        assert_eq!(
            reader,
            ToolFlags {
                read_only: true,
                destructive: false,
                idempotent: true
            }
        );
        let safe_writer = ToolFlags::from_hints(Some(false), Some(false), Some(true), None);
        assert_eq!(
            safe_writer,
            ToolFlags {
                read_only: false,
                destructive: false,
                idempotent: true
            }
        );
    }

    #[test]
    fn the_file_overrides_the_hints() {
        let overrides = FlagOverrides {
            read_only: Some(false),
            destructive: None,
            idempotent: Some(false),
        };
        // A server that claims read-only is not believed: the tool is a destructive writer.
        let flags = ToolFlags::from_hints(Some(true), None, Some(true), Some(&overrides));
        assert_eq!(
            flags,
            ToolFlags {
                read_only: false,
                destructive: true,
                idempotent: false
            }
        );
    }

    #[test]
    fn allow_and_deny_lists_filter_by_mcp_name() {
        let mut spec = ServerSpec::new(
            "s",
            TransportSpec::Http {
                url: "http://127.0.0.1:1/mcp".into(),
                headers: Vec::new(),
            },
            "http://127.0.0.1:1/mcp",
        );
        assert!(spec.offers("anything"));
        spec.allow = vec!["echo".into(), "add".into()];
        spec.deny = vec!["add".into()];
        assert!(spec.offers("echo"));
        assert!(!spec.offers("add"));
        assert!(!spec.offers("other"));
    }
}

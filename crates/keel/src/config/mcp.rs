//! The MCP servers of a `keel.toml`: `[mcp.NAME]` (shared by the agents it names, or all) and
//! `[agents.mcp.NAME]` (one agent's own). What the file must say of each, which servers an
//! agent gets, and the [`ServerSpec`] each becomes for `keel-mcp`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_mcp::{FlagOverrides, Header, McpServer, McpToolSet, ServerSpec, TransportSpec};

use super::error::ConfigError;
use super::types::{AgentConfig, Config, McpServerConfig};
use super::SecondsRange;

/// The timeouts an MCP server's calls and start accept.
pub const MCP_TIMEOUT_SECONDS: SecondsRange = SecondsRange::new(0.001, 86_400.0);

/// Which declaration of a server: a shared `[mcp.NAME]`, or an agent's own.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum ServerKey {
    /// `[mcp.NAME]`.
    Shared(String),
    /// `[agents.mcp.NAME]` of the agent named first.
    Own(String, String),
}

impl ServerKey {
    /// The server's name.
    fn name(&self) -> &str {
        match self {
            Self::Shared(name) | Self::Own(_, name) => name,
        }
    }

    /// The field the file declares it at.
    pub(crate) fn field(&self) -> String {
        match self {
            Self::Shared(name) => format!("mcp.{name}"),
            Self::Own(agent, name) => format!("agents.{agent}.mcp.{name}"),
        }
    }
}

impl Config {
    /// The MCP servers `agent` gets, by name: its own, then the shared ones that name it (or
    /// name no agent).
    pub fn mcp_servers_of<'a>(
        &'a self,
        agent: &'a AgentConfig,
    ) -> Vec<(&'a str, &'a McpServerConfig)> {
        let own = agent.mcp.iter();
        let shared = self.mcp.iter().filter(|(_, server)| match &server.agents {
            None => true,
            Some(names) => names.iter().any(|n| n.get_ref() == agent.name()),
        });
        own.chain(shared)
            .map(|(name, server)| (name.as_str(), server))
            .collect()
    }

    /// Whether some agent gets an MCP server (and so the agents must be built with
    /// [`super::AgentSetBuilder::connect`], which starts them).
    pub fn uses_mcp(&self) -> bool {
        self.agents
            .iter()
            .any(|agent| !self.mcp_servers_of(agent).is_empty())
    }

    /// Each server some agent gets, once, with the agents that get it (in the file's order).
    pub(crate) fn mcp_users(&self) -> BTreeMap<ServerKey, Vec<&str>> {
        let mut users: BTreeMap<ServerKey, Vec<&str>> = BTreeMap::new();
        for agent in &self.agents {
            for (name, _) in self.mcp_servers_of(agent) {
                let key = if agent.mcp.contains_key(name) {
                    ServerKey::Own(agent.name().to_owned(), name.to_owned())
                } else {
                    ServerKey::Shared(name.to_owned())
                };
                users.entry(key).or_default().push(agent.name());
            }
        }
        users
    }

    fn mcp_server(&self, key: &ServerKey) -> Option<&McpServerConfig> {
        match key {
            ServerKey::Shared(name) => self.mcp.get(name),
            ServerKey::Own(agent, name) => self.agent(agent).and_then(|a| a.mcp.get(name)),
        }
    }
}

/// What serde cannot check of the MCP servers: names, one transport each, the fields that go
/// with it, timeouts, the agents a shared server names, a name given twice to one agent.
pub(super) fn check(config: &Config, text: &str, path: &Path) -> Result<(), ConfigError> {
    let names: Vec<&str> = config.agents.iter().map(AgentConfig::name).collect();
    let declared = config
        .mcp
        .iter()
        .map(|(name, server)| (format!("mcp.{name}"), name, server, true))
        .chain(config.agents.iter().enumerate().flat_map(|(i, agent)| {
            agent
                .mcp
                .iter()
                .map(move |(name, server)| (format!("agents[{i}].mcp.{name}"), name, server, false))
        }));
    for (field, name, server, shared) in declared {
        let whole = |rest: &str, message: String| {
            ConfigError::whole(path, format!("{field}{rest}"), message)
        };
        if !super::is_plain_name(name) {
            return Err(whole(
                "",
                format!("`{name}` must be letters, digits, `-` or `_` (it prefixes tool names)"),
            ));
        }
        match (&server.command, &server.url) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(whole(
                    "",
                    "give `command` (a stdio server) or `url` (streamable HTTP), one of them"
                        .into(),
                ))
            }
            (Some(command), None) => {
                if command.get_ref().trim().is_empty() {
                    return Err(ConfigError::at(
                        path,
                        text,
                        Some(command.span()),
                        format!("{field}.command"),
                        "the command is empty",
                    ));
                }
                if !server.headers.is_empty() {
                    return Err(whole(
                        ".headers",
                        "headers are for an HTTP server (`url`)".into(),
                    ));
                }
            }
            (None, Some(url)) => {
                if !url.value().starts_with("http://") && !url.value().starts_with("https://") {
                    return Err(whole(
                        ".url",
                        format!("`{url}` must start with http:// or https://"),
                    ));
                }
                for (rest, given) in [
                    (".args", !server.args.is_empty()),
                    (".env", !server.env.is_empty()),
                    (".cwd", server.cwd.is_some()),
                ] {
                    if given {
                        return Err(whole(rest, "this is for a stdio server (`command`)".into()));
                    }
                }
                for (header, value) in &server.headers {
                    let valid_name = http::HeaderName::from_bytes(header.as_bytes()).is_ok();
                    if !valid_name || http::HeaderValue::from_str(value.value()).is_err() {
                        return Err(whole(
                            &format!(".headers.{header}"),
                            "not a valid HTTP header".into(),
                        ));
                    }
                }
            }
        }
        for (rest, seconds) in [
            (".timeout_seconds", server.timeout_seconds),
            (".startup_timeout_seconds", server.startup_timeout_seconds),
        ] {
            if let Some(seconds) = seconds {
                MCP_TIMEOUT_SECONDS
                    .check(seconds)
                    .map_err(|range| whole(rest, range))?;
            }
        }
        match (&server.agents, shared) {
            (Some(_), false) => {
                return Err(whole(
                    ".agents",
                    "an agent's own server serves only it; `agents` is for a shared [mcp.NAME]"
                        .into(),
                ))
            }
            (Some(agents), true) => {
                for agent in agents {
                    if !names.contains(&agent.get_ref().as_str()) {
                        return Err(ConfigError::at(
                            path,
                            text,
                            Some(agent.span()),
                            format!("{field}.agents"),
                            format!("no agent is named `{}`", agent.get_ref()),
                        )
                        .suggest_from(agent.get_ref(), names.iter().copied()));
                    }
                }
            }
            (None, _) => {}
        }
    }
    for (i, agent) in config.agents.iter().enumerate() {
        let mut seen = HashSet::new();
        for (name, _) in config.mcp_servers_of(agent) {
            if !seen.insert(name) {
                return Err(ConfigError::whole(
                    path,
                    format!("agents[{i}].mcp.{name}"),
                    format!(
                        "the agent already gets the shared MCP server `{name}`; give this one \
                         another name"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The spec `keel-mcp` starts the server from; `base` is the directory of `keel.toml`, which
/// a relative `cwd` is taken from.
pub(crate) fn spec(name: &str, server: &McpServerConfig, base: &Path) -> ServerSpec {
    let transport = match (&server.command, &server.url) {
        (Some(command), _) => TransportSpec::Stdio {
            command: command.get_ref().clone(),
            args: server.args.iter().map(|a| a.value().to_owned()).collect(),
            env: server
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.value().to_owned()))
                .collect(),
            cwd: server.cwd.as_ref().map(|cwd| base.join(cwd)),
        },
        (None, url) => TransportSpec::Http {
            url: url
                .as_ref()
                .map(|u| u.value().to_owned())
                .unwrap_or_default(),
            headers: server
                .headers
                .iter()
                .map(|(name, value)| Header {
                    name: name.clone(),
                    value: value.value().to_owned(),
                    secret: value.is_secret(),
                })
                .collect(),
        },
    };
    let mut spec = ServerSpec::new(name, transport, server.shown());
    spec.allow.clone_from(&server.allow_tools);
    spec.deny.clone_from(&server.deny_tools);
    spec.capabilities.clone_from(&server.capabilities);
    if let Some(seconds) = server.timeout_seconds {
        spec.call_timeout = Duration::from_secs_f64(seconds);
    }
    if let Some(seconds) = server.startup_timeout_seconds {
        spec.startup_timeout = Duration::from_secs_f64(seconds);
    }
    spec.overrides = server
        .tools
        .iter()
        .map(|(tool, flags)| {
            let overrides = FlagOverrides {
                read_only: flags.read_only,
                destructive: flags.destructive,
                idempotent: flags.idempotent,
            };
            (tool.clone(), overrides)
        })
        .collect();
    spec
}

/// Start every server some agent of the file gets (all at once), and make each agent's MCP
/// tools: `{server}_{tool}`, unique within the agent, following the servers' list changes.
/// A server that does not start is an error naming it, its field and its command or URL.
pub(crate) async fn connect(
    config: &super::LoadedConfig,
) -> Result<HashMap<String, Arc<McpToolSet>>, ConfigError> {
    let path = &config.path;
    let base = path.parent().unwrap_or_else(|| Path::new(".")).to_owned();
    let users = config.mcp_users();
    let mut starting = tokio::task::JoinSet::new();
    for key in users.keys() {
        let Some(server) = config.mcp_server(key) else {
            continue;
        };
        let spec = spec(key.name(), server, &base);
        let key = key.clone();
        starting.spawn(async move { (key, McpServer::start(spec).await) });
    }
    let mut started: BTreeMap<ServerKey, Arc<McpServer>> = BTreeMap::new();
    let mut failed = None;
    while let Some(joined) = starting.join_next().await {
        let (key, result) =
            joined.map_err(|err| ConfigError::whole(path, "mcp", err.to_string()))?;
        match result {
            Ok(server) => {
                started.insert(key, server);
            }
            Err(err) => {
                failed.get_or_insert((key, err));
            }
        }
    }
    if let Some((key, err)) = failed {
        for server in started.values() {
            server.shutdown().await;
        }
        return Err(ConfigError::whole(path, key.field(), err.to_string()));
    }
    let mut tools = HashMap::new();
    for agent in &config.agents {
        let mine: Vec<_> = started
            .iter()
            .filter(|(key, _)| users[*key].contains(&agent.name()))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let servers = mine.iter().map(|(_, server)| Arc::clone(server)).collect();
        let set = McpToolSet::connect(servers).await.map_err(|err| {
            // The error names the server that could not list its tools: so does its field.
            let field = mine
                .iter()
                .find(|(_, server)| server.spec().name == err.server())
                .map_or_else(|| "mcp".to_owned(), |(key, _)| key.field());
            ConfigError::whole(path, field, err.to_string())
        })?;
        tools.insert(agent.name().to_owned(), Arc::new(set));
    }
    Ok(tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadedConfig;

    fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
        Config::parse(text, "/srv/app/keel.toml")
    }

    /// The field the error of `text` names.
    fn field_of(text: &str) -> String {
        parse(text).unwrap_err().field.clone()
    }

    const AGENTS: &str = "[[agents]]\nname = \"a\"\ndescription = \"A.\"\n\
                          [[agents]]\nname = \"b\"\ndescription = \"B.\"\n";

    #[test]
    fn a_server_needs_exactly_one_transport_with_its_own_fields() {
        let both = parse(&format!(
            "[mcp.s]\ncommand = \"x\"\nurl = \"http://h/mcp\"\n{AGENTS}"
        ))
        .unwrap_err();
        assert_eq!(both.field, "mcp.s");
        assert!(
            both.message.starts_with("give `command`"),
            "{}",
            both.message
        );
        assert_eq!(
            field_of(&format!("{AGENTS}[agents.mcp.s]\nallow_tools = []\n")),
            "agents[1].mcp.s"
        );
        assert_eq!(
            field_of(&format!(
                "[mcp.s]\ncommand = \"x\"\nheaders = {{ A = \"b\" }}\n{AGENTS}"
            )),
            "mcp.s.headers"
        );
        assert_eq!(
            field_of(&format!(
                "[mcp.s]\nurl = \"http://h/mcp\"\nargs = [\"-v\"]\n{AGENTS}"
            )),
            "mcp.s.args"
        );
        assert_eq!(
            field_of(&format!("[mcp.s]\nurl = \"ftp://h/mcp\"\n{AGENTS}")),
            "mcp.s.url"
        );
        assert_eq!(
            field_of(&format!("[mcp.\"a b\"]\ncommand = \"x\"\n{AGENTS}")),
            "mcp.a b"
        );
        assert_eq!(
            field_of(&format!(
                "[mcp.s]\ncommand = \"x\"\ntimeout_seconds = 0\n{AGENTS}"
            )),
            "mcp.s.timeout_seconds"
        );
    }

    #[test]
    fn a_shared_server_goes_to_the_agents_it_names_or_to_all() {
        let config = parse(&format!(
            "[mcp.all]\ncommand = \"x\"\n[mcp.only_b]\ncommand = \"y\"\nagents = [\"b\"]\n\
             {AGENTS}[agents.mcp.own]\ncommand = \"z\"\n"
        ))
        .unwrap();
        let of = |agent: &str| -> Vec<String> {
            let agent = config.agent(agent).unwrap();
            config
                .mcp_servers_of(agent)
                .into_iter()
                .map(|(name, _)| name.to_owned())
                .collect()
        };
        assert_eq!(of("a"), ["all"]);
        assert_eq!(of("b"), ["own", "all", "only_b"]);
        assert!(config.uses_mcp());
        let unknown = parse(&format!(
            "[mcp.s]\ncommand = \"x\"\nagents = [\"bb\"]\n{AGENTS}"
        ))
        .unwrap_err();
        assert_eq!(unknown.field, "mcp.s.agents");
        assert_eq!(unknown.suggestion.as_deref(), Some("b"));
        assert_eq!(
            field_of(&format!(
                "{AGENTS}[agents.mcp.s]\ncommand = \"x\"\nagents = [\"a\"]\n"
            )),
            "agents[1].mcp.s.agents"
        );
        assert_eq!(
            field_of(&format!(
                "[mcp.s]\ncommand = \"x\"\n{AGENTS}[agents.mcp.s]\ncommand = \"y\"\n"
            )),
            "agents[1].mcp.s"
        );
    }

    #[test]
    fn the_spec_takes_every_field_and_shows_secrets_masked() {
        std::env::set_var("KEEL_TEST_MCP_TOKEN", "s3cr3t-token");
        let config = parse(&format!(
            "[mcp.web]\nurl = \"https://mcp.example.com/mcp\"\n\
             headers = {{ Authorization = \"Bearer ${{KEEL_TEST_MCP_TOKEN}}\", X-Plain = \"p\" }}\n\
             allow_tools = [\"a\", \"b\"]\ndeny_tools = [\"b\"]\ntimeout_seconds = 2.5\n\
             startup_timeout_seconds = 9\ncapabilities = [\"net.web\"]\n\
             [mcp.web.tools.a]\nread_only = false\nidempotent = true\n\
             [mcp.local]\ncommand = \"server\"\nargs = [\"--key\", \"${{KEEL_TEST_MCP_TOKEN}}\"]\n\
             env = {{ MODE = \"test\" }}\ncwd = \"data\"\n{AGENTS}"
        ))
        .unwrap();
        let web = spec("web", &config.mcp["web"], Path::new("/srv/app"));
        let TransportSpec::Http { url, headers } = &web.transport else {
            panic!("an HTTP server");
        };
        assert_eq!(url, "https://mcp.example.com/mcp");
        let auth = headers.iter().find(|h| h.name == "Authorization").unwrap();
        assert_eq!(auth.value, "Bearer s3cr3t-token");
        assert!(auth.secret);
        assert!(!headers.iter().find(|h| h.name == "X-Plain").unwrap().secret);
        assert_eq!((web.allow.len(), web.deny.len()), (2, 1));
        assert_eq!(web.call_timeout, Duration::from_millis(2500));
        assert_eq!(web.startup_timeout, Duration::from_secs(9));
        assert_eq!(web.capabilities, ["net.web"]);
        assert_eq!(
            web.overrides["a"],
            FlagOverrides {
                read_only: Some(false),
                destructive: None,
                idempotent: Some(true)
            }
        );
        let local = spec("local", &config.mcp["local"], Path::new("/srv/app"));
        let TransportSpec::Stdio {
            command,
            args,
            env,
            cwd,
        } = &local.transport
        else {
            panic!("a stdio server");
        };
        assert_eq!(command, "server");
        assert_eq!(args, &["--key", "s3cr3t-token"]);
        assert_eq!(env, &[("MODE".to_owned(), "test".to_owned())]);
        assert_eq!(cwd.as_deref(), Some(Path::new("/srv/app/data")));
        assert_eq!(local.shown, "server --key ****");
        assert!(!web.shown.contains("s3cr3t"));
    }

    #[test]
    fn build_refuses_a_file_whose_servers_were_not_started() {
        let config = parse(&format!("[mcp.s]\ncommand = \"x\"\n{AGENTS}")).unwrap();
        let runtime = Arc::new(crate::DefaultRuntime::offline());
        let err = config
            .agents()
            .build(runtime)
            .err()
            .expect("built without starting the MCP server");
        assert_eq!(err.field, "mcp");
        assert!(err.message.contains("`connect`"), "{}", err.message);
    }

    #[tokio::test]
    async fn connect_names_a_server_that_does_not_start_and_its_command() {
        let config = parse(&format!(
            "{AGENTS}[agents.mcp.ghost]\ncommand = \"keel-no-such-mcp-server\"\nargs = [\"--x\"]\n"
        ))
        .unwrap();
        let runtime = Arc::new(crate::DefaultRuntime::offline());
        let err = config
            .agents()
            .connect(runtime)
            .await
            .err()
            .expect("a missing command started");
        assert_eq!(err.field, "agents.b.mcp.ghost");
        assert!(
            err.message.starts_with(
                "MCP server `ghost` (keel-no-such-mcp-server --x) did not start: cannot run it"
            ),
            "{}",
            err.message
        );
    }

    #[tokio::test]
    async fn connect_without_servers_starts_nothing_and_builds() {
        let config = parse(AGENTS).unwrap();
        let runtime = Arc::new(crate::DefaultRuntime::offline());
        let agents = config.agents().connect(runtime).await.unwrap();
        assert!(agents
            .iter()
            .all(|a| a.mcp.is_none() && a.mcp_tools().is_empty()));
    }
}

//! `keel tools`: the tools each agent's model sees, wherever they come from (the engine, the
//! file's HTTP tools and remote agents, MCP servers), with their schemas and flags — the
//! first command to run after declaring a server.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use keel::agent::{Agent, Tool as _};
use keel::config::{AgentConfig, LoadedConfig, DEFAULT_CONFIG_FILE};
use keel::mcp::McpTool;
use keel::{Config, DefaultRuntime};
use serde_json::{json, Value};

/// `keel tools [--agent NAME] [--config FILE] [--json]`: from the file (default
/// `./keel.toml` when it exists, else the demo agent), its MCP servers started to list them.
pub(crate) async fn list(
    config: Option<PathBuf>,
    agent: Option<String>,
    json_out: bool,
) -> Result<(), String> {
    let path = config.or_else(|| Some(PathBuf::from(DEFAULT_CONFIG_FILE)).filter(|p| p.exists()));
    let listed: Vec<Value> = match path {
        None => {
            if let Some(name) = agent.as_deref().filter(|n| *n != "keel-demo") {
                return Err(format!(
                    "no agent `{name}`: there is no keel.toml here (give --config FILE)"
                ));
            }
            let demo = keel::demo::agent().map_err(|err| err.to_string())?;
            vec![agent_tools(&demo, None, &[])]
        }
        Some(path) => {
            let loaded = Config::from_path(&path).map_err(|err| err.to_string())?;
            let agents = loaded
                .agents()
                .connect(Arc::new(DefaultRuntime::offline()))
                .await
                .map_err(|err| err.to_string())?;
            let chosen: Vec<_> = match &agent {
                Some(name) => vec![agents.get(name).ok_or_else(|| {
                    let known: Vec<String> =
                        agents.iter().map(|a| format!("`{}`", a.name)).collect();
                    format!(
                        "{} declares no agent `{name}` (it has {})",
                        path.display(),
                        known.join(", ")
                    )
                })?],
                None => agents.iter().collect(),
            };
            chosen
                .into_iter()
                .map(|configured| {
                    agent_tools(
                        configured.executor.agent(),
                        loaded.agent(&configured.name).map(|a| (&loaded, a)),
                        &configured.mcp_tools(),
                    )
                })
                .collect()
        }
    };
    if json_out {
        let text = serde_json::to_string_pretty(&listed).map_err(|err| err.to_string())?;
        println!("{text}");
    } else {
        print!("{}", render(&listed));
    }
    Ok(())
}

/// One agent and its tools, as JSON: `{"agent", "tools": [{"name", "source", "description",
/// "parameters", "idempotent", "capabilities", ...}]}`.
fn agent_tools(
    agent: &Agent,
    declared: Option<(&LoadedConfig, &AgentConfig)>,
    mcp_tools: &[Arc<McpTool>],
) -> Value {
    let mut tools: Vec<Value> = agent
        .tools()
        .iter()
        .map(|tool| {
            let name = tool.name();
            let mut entry = json!({
                "name": name,
                "description": tool.description(),
                "parameters": tool.parameters(),
                "idempotent": tool.idempotent(),
                "capabilities": tool.capabilities(),
            });
            let fields = entry.as_object_mut().expect("an object");
            if let Some(mcp) = mcp_tools.iter().find(|t| t.name() == name) {
                let flags = mcp.flags();
                fields.insert("source".into(), json!("mcp"));
                fields.insert("server".into(), json!(mcp.server().spec().name));
                fields.insert("mcp_name".into(), json!(mcp.mcp_name()));
                fields.insert("read_only".into(), json!(flags.read_only));
                fields.insert("destructive".into(), json!(flags.destructive));
            } else {
                fields.insert("source".into(), json!(source_of(name, declared)));
            }
            entry
        })
        .collect();
    // The tools the engine answers itself (lifecycle, hand-off) are offered but are no
    // `Tool` of the agent: listed from the specs.
    for spec in agent.tool_specs() {
        if !tools.iter().any(|t| t["name"] == spec.name.as_str()) {
            tools.push(json!({
                "name": spec.name,
                "source": "built-in",
                "description": spec.description,
                "parameters": spec.parameters,
                "idempotent": false,
                "capabilities": [],
            }));
        }
    }
    json!({"agent": agent.card().name, "tools": tools})
}

/// Where a tool that is not an MCP server's comes from.
fn source_of(name: &str, declared: Option<(&LoadedConfig, &AgentConfig)>) -> &'static str {
    let Some((_, agent)) = declared else {
        return "built-in";
    };
    if agent.tools.http.iter().any(|t| t.name.get_ref() == name) {
        "http"
    } else if agent.remote_agents.iter().any(|r| r.name.get_ref() == name) {
        "remote agent"
    } else {
        "built-in"
    }
}

/// The listing for a terminal: per agent, each tool with its source, flags, capabilities,
/// description and schema.
fn render(listed: &[Value]) -> String {
    let mut out = String::new();
    for agent in listed {
        let tools = agent["tools"].as_array().map_or(&[][..], Vec::as_slice);
        let _ = writeln!(
            out,
            "agent `{}`: {} tools",
            agent["agent"].as_str().unwrap_or_default(),
            tools.len()
        );
        for tool in tools {
            let source = match (tool["source"].as_str(), tool["server"].as_str()) {
                (Some("mcp"), Some(server)) => format!(
                    "mcp server `{server}`, tool `{}`",
                    tool["mcp_name"].as_str().unwrap_or_default()
                ),
                (source, _) => source.unwrap_or_default().to_owned(),
            };
            let flags: Vec<&str> = ["read_only", "destructive", "idempotent"]
                .into_iter()
                .filter(|flag| tool[*flag] == true)
                .collect();
            let _ = writeln!(
                out,
                "  {} ({source}){}",
                tool["name"].as_str().unwrap_or_default(),
                if flags.is_empty() {
                    String::new()
                } else {
                    format!(" [{}]", flags.join(", "))
                }
            );
            let capabilities: Vec<&str> = tool["capabilities"]
                .as_array()
                .map(|c| c.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if !capabilities.is_empty() {
                let _ = writeln!(out, "    capabilities: {}", capabilities.join(", "));
            }
            if let Some(description) = tool["description"].as_str().filter(|d| !d.is_empty()) {
                let _ = writeln!(out, "    {}", description.replace('\n', "\n    "));
            }
            let _ = writeln!(out, "    parameters: {}", tool["parameters"]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_agents_tools_are_listed_with_schemas_and_sources() {
        let demo = keel::demo::agent().unwrap();
        let listed = agent_tools(&demo, None, &[]);
        let tools = listed["tools"].as_array().unwrap();
        assert!(!tools.is_empty());
        for tool in tools {
            assert_eq!(tool["source"], "built-in");
            assert!(tool["parameters"].is_object(), "{tool}");
        }
        let text = render(&[listed]);
        assert!(text.starts_with("agent `keel-demo`: "), "{text}");
        assert!(text.contains("    parameters: {"), "{text}");
    }
}

//! [`McpToolSet`]: the MCP tools of one agent, from all its servers, kept in step with the
//! servers' lists: a server's `notifications/tools/list_changed` (or its restart) makes the
//! set list that server again before the agent's next step.

use std::collections::HashSet;
use std::sync::{Arc, Mutex as StdMutex};

use async_trait::async_trait;
use keel_agent::{Tool, ToolSource};
use tokio::sync::Mutex;

use crate::server::McpServer;
use crate::tool::McpTool;
use crate::McpError;

/// The tools an agent gets from its MCP servers, named as [`McpTool::list`] names them (in
/// the servers' order, so that two servers' tools never collide). Give it to an agent with
/// [`AgentBuilder::tool_source`](keel_agent::AgentBuilder::tool_source): the agent then
/// offers each step the tools the servers list at that moment.
pub struct McpToolSet {
    /// Each server and the list it last gave.
    lists: Mutex<Vec<Listed>>,
    /// The tools made of those lists.
    tools: StdMutex<Vec<Arc<McpTool>>>,
}

/// One server's list, and the server's tools generation when it was asked for it.
struct Listed {
    server: Arc<McpServer>,
    generation: u64,
    tools: Vec<rmcp::model::Tool>,
}

impl McpToolSet {
    /// List the tools of every one of `servers` (started already), in this order.
    pub async fn connect(servers: Vec<Arc<McpServer>>) -> Result<Self, McpError> {
        let mut lists = Vec::with_capacity(servers.len());
        for server in servers {
            let generation = server.tools_generation();
            let tools = server.list_tools().await?;
            lists.push(Listed {
                server,
                generation,
                tools,
            });
        }
        let tools = make_tools(&lists);
        Ok(Self {
            lists: Mutex::new(lists),
            tools: StdMutex::new(tools),
        })
    }

    /// Its tools as of the last refresh.
    pub fn mcp_tools(&self) -> Vec<Arc<McpTool>> {
        self.tools.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// List again each server whose list may have changed since it was last listed; whether
    /// any did. A server that cannot be listed keeps its former tools (a warning says why),
    /// and is asked again next time.
    pub async fn refresh(&self) -> bool {
        let mut lists = self.lists.lock().await;
        let mut changed = false;
        for listed in lists.iter_mut() {
            let generation = listed.server.tools_generation();
            if generation == listed.generation {
                continue;
            }
            match listed.server.list_tools().await {
                Ok(tools) => {
                    changed |= tools != listed.tools;
                    listed.tools = tools;
                    listed.generation = generation;
                }
                Err(err) => {
                    tracing::warn!(server = %listed.server.spec().name, error = %err, "the changed tool list of an MCP server could not be listed; its former tools stay");
                }
            }
        }
        if changed {
            let tools = make_tools(&lists);
            *self.tools.lock().unwrap_or_else(|p| p.into_inner()) = tools;
        }
        changed
    }
}

/// The tools of `lists`, named uniquely in their order.
fn make_tools(lists: &[Listed]) -> Vec<Arc<McpTool>> {
    let mut taken = HashSet::new();
    lists
        .iter()
        .flat_map(|listed| McpTool::of_listed(&listed.server, listed.tools.clone(), &mut taken))
        .map(Arc::new)
        .collect()
}

#[async_trait]
impl ToolSource for McpToolSet {
    fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.mcp_tools()
            .into_iter()
            .map(|tool| tool as Arc<dyn Tool>)
            .collect()
    }

    async fn refresh(&self) -> bool {
        McpToolSet::refresh(self).await
    }
}

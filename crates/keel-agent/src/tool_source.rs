//! Tools whose list changes while an agent runs: a [`ToolSource`] (an MCP server's tools,
//! which the server may change and announce with `notifications/tools/list_changed`), and the
//! table of an agent's tools that the engine reads at each step.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use keel_core::{AgentError, AgentResult};
use keel_llm::ToolSpec;

use crate::agent::RegisteredTool;
use crate::Tool;

/// Tools an agent takes from something that may change them while the agent runs. The
/// engine calls [`refresh`](ToolSource::refresh) before each model step (and before a direct
/// tool call) and, when it says the tools changed, offers what [`tools`](ToolSource::tools)
/// gives from then on: new tools are offered and callable, removed ones are gone.
#[async_trait]
pub trait ToolSource: Send + Sync {
    /// The tools as the source last knew them. Cheap: no I/O.
    fn tools(&self) -> Vec<Arc<dyn Tool>>;

    /// Fetch the tools again if the source knows they changed since the last fetch, and say
    /// whether they did. Called before every step, so it must be cheap when nothing changed.
    /// A fetch that fails keeps the tools the source had (the source logs why).
    async fn refresh(&self) -> bool;
}

/// How replay wraps each tool (so that a source's tools are wrapped as the declared ones).
pub(crate) type WrapFn = dyn Fn(Arc<dyn Tool>) -> Arc<dyn Tool> + Send + Sync;

/// An agent's tools at one moment: checked, indexed by name, and as offered to a model.
pub(crate) struct ToolTable {
    pub(crate) tools: Vec<Arc<RegisteredTool>>,
    index: HashMap<String, usize>,
    /// What a model is offered: the tools, then the built-in ones the engine answers itself.
    /// Shared, so that a step whose tools did not change reuses its token estimate.
    pub(crate) specs: Arc<Vec<ToolSpec>>,
}

impl ToolTable {
    /// The table of `fixed` (checked when the agent was built) and `sourced`, with the
    /// built-in specs `builtin` at the end. A sourced tool whose name is taken, or whose
    /// schema does not compile, is an error when `strict` (building the agent) and left out
    /// with a warning otherwise (a list that changed while the agent runs).
    pub(crate) fn new(
        fixed: &[Arc<RegisteredTool>],
        sourced: Vec<Arc<dyn Tool>>,
        builtin: &[ToolSpec],
        strict: bool,
    ) -> AgentResult<Self> {
        let mut tools = fixed.to_vec();
        let mut index: HashMap<String, usize> = tools
            .iter()
            .enumerate()
            .map(|(i, t)| (t.tool.name().to_owned(), i))
            .collect();
        for tool in sourced {
            let name = tool.name().to_owned();
            let problem = if name.is_empty() {
                Some(AgentError::invalid_input("tool.name", "must not be empty"))
            } else if index.contains_key(&name) || builtin.iter().any(|b| b.name == name) {
                Some(AgentError::invalid_input(
                    "tool.name",
                    format!("`{name}` is declared twice"),
                ))
            } else {
                None
            };
            let registered = match problem {
                Some(err) => Err(err),
                None => RegisteredTool::new(tool),
            };
            match registered {
                Ok(registered) => {
                    index.insert(name, tools.len());
                    tools.push(Arc::new(registered));
                }
                Err(err) if strict => return Err(err),
                Err(err) => {
                    tracing::warn!(tool = %name, error = %err, "a changed tool is not offered");
                }
            }
        }
        let specs = tools
            .iter()
            .map(|t| ToolSpec {
                name: t.tool.name().to_owned(),
                description: t.tool.description().to_owned(),
                parameters: t.tool.parameters(),
            })
            .chain(builtin.iter().cloned())
            .collect();
        Ok(Self {
            tools,
            index,
            specs: Arc::new(specs),
        })
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.index.get(name).map(|&i| &self.tools[i])
    }
}

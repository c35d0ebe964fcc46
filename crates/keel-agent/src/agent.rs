//! Agent definitions: a card, instructions, a model, tools and limits.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use keel_core::{AgentCard, AgentError, AgentResult};
use keel_llm::{Llm, ToolSpec};
use serde_json::Value;

use crate::Tool;

pub(crate) struct RegisteredTool {
    pub(crate) tool: Arc<dyn Tool>,
    validator: jsonschema::Validator,
}

impl RegisteredTool {
    /// Check arguments against the tool's schema; the error lists every violation.
    pub(crate) fn validate(&self, args: &Value) -> AgentResult<()> {
        let problems: Vec<String> = self
            .validator
            .iter_errors(args)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(AgentError::invalid_input(
                format!("arguments of `{}`", self.tool.name()),
                problems.join("; "),
            ))
        }
    }
}

/// An agent definition. Build one with [`Agent::builder`].
pub struct Agent {
    card: AgentCard,
    instructions: String,
    llm: Option<Arc<dyn Llm>>,
    tools: Vec<RegisteredTool>,
    tool_index: HashMap<String, usize>,
    max_steps: u32,
}

impl fmt::Debug for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.card.name)
            .field("tools", &self.tool_index.keys().collect::<Vec<_>>())
            .field("max_steps", &self.max_steps)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// The default step limit.
    pub const DEFAULT_MAX_STEPS: u32 = 8;

    /// Start building an agent with this card.
    pub fn builder(card: AgentCard) -> AgentBuilder {
        AgentBuilder {
            card,
            instructions: String::new(),
            llm: None,
            tools: Vec::new(),
            max_steps: Self::DEFAULT_MAX_STEPS,
        }
    }

    /// The agent's card.
    pub fn card(&self) -> &AgentCard {
        &self.card
    }

    /// The system instructions.
    pub fn instructions(&self) -> &str {
        &self.instructions
    }

    /// The agent's own model, if it brings one (else the runtime's default is used).
    pub fn llm(&self) -> Option<&Arc<dyn Llm>> {
        self.llm.as_ref()
    }

    /// The most model steps one run may take.
    pub fn max_steps(&self) -> u32 {
        self.max_steps
    }

    /// The tools as offered to a model.
    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .map(|t| ToolSpec {
                name: t.tool.name().to_owned(),
                description: t.tool.description().to_owned(),
                parameters: t.tool.parameters(),
            })
            .collect()
    }

    pub(crate) fn tool(&self, name: &str) -> Option<&RegisteredTool> {
        self.tool_index.get(name).map(|&i| &self.tools[i])
    }
}

/// Builds an [`Agent`]; [`AgentBuilder::build`] checks the tools.
#[must_use]
pub struct AgentBuilder {
    card: AgentCard,
    instructions: String,
    llm: Option<Arc<dyn Llm>>,
    tools: Vec<Arc<dyn Tool>>,
    max_steps: u32,
}

impl AgentBuilder {
    /// The system instructions.
    pub fn instructions(mut self, instructions: impl Into<String>) -> Self {
        self.instructions = instructions.into();
        self
    }

    /// The agent's own model.
    pub fn llm(mut self, llm: impl Llm + 'static) -> Self {
        self.llm = Some(Arc::new(llm));
        self
    }

    /// The agent's own model, shared.
    pub fn llm_shared(mut self, llm: Arc<dyn Llm>) -> Self {
        self.llm = Some(llm);
        self
    }

    /// Add a tool.
    pub fn tool(mut self, tool: impl Tool + 'static) -> Self {
        self.tools.push(Arc::new(tool));
        self
    }

    /// Add a shared tool.
    pub fn tool_shared(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// The most model steps one run may take (at least 1).
    pub fn max_steps(mut self, max_steps: u32) -> Self {
        self.max_steps = max_steps;
        self
    }

    /// Check and build. A tool with an invalid JSON schema, a duplicate tool name or a zero
    /// step limit is [`AgentError::InvalidInput`].
    pub fn build(self) -> AgentResult<Agent> {
        if self.max_steps == 0 {
            return Err(AgentError::invalid_input("max_steps", "must be at least 1"));
        }
        let mut tools = Vec::with_capacity(self.tools.len());
        let mut tool_index = HashMap::new();
        for tool in self.tools {
            let name = tool.name().to_owned();
            if name.is_empty() {
                return Err(AgentError::invalid_input("tool.name", "must not be empty"));
            }
            let validator = jsonschema::validator_for(&tool.parameters()).map_err(|e| {
                AgentError::invalid_input(format!("parameters of tool `{name}`"), e.to_string())
            })?;
            if tool_index.insert(name.clone(), tools.len()).is_some() {
                return Err(AgentError::invalid_input(
                    "tool.name",
                    format!("`{name}` is declared twice"),
                ));
            }
            tools.push(RegisteredTool { tool, validator });
        }
        let mut card = self.card;
        card.capabilities.tool_calling |= !tools.is_empty();
        Ok(Agent {
            card,
            instructions: self.instructions,
            llm: self.llm,
            tools,
            tool_index,
            max_steps: self.max_steps,
        })
    }
}

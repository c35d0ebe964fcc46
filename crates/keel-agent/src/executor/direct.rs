//! A task whose latest message is made of explicit parts runs them without the model loop
//! (seed 001's default lifecycle): `tool_call` parts call their tools, `infer` parts make
//! one model call each, an `error` part fails the task and a `status` part asking for input
//! leaves it input-required. A message of `tool_call` parts only keeps its own path
//! (`run_direct`, decision 6); this one adds the other kinds.

use keel_core::{AgentError, AgentResult, Message, Part, PartContent, TaskState};
use keel_llm::{prepare_manifest, LlmMessage, LlmRequest, LlmRole, ManifestIds, ToolCall};
use serde_json::{json, Value};

use super::run::RunLoop;
use super::state::*;
use super::step::CallSite;

/// History metadata key on the entries of an `infer` part: `<message id>:<part index>`, so
/// that a run resumed after a crash does not ask the model again.
const META_INFER: &str = "keel.infer_part";

/// One explicit part of a message, in order.
pub(super) enum Explicit {
    Call(ToolCall),
    Infer {
        key: String,
        prompt: Option<String>,
        output_schema: Option<Value>,
    },
    Error {
        message: String,
        code: Option<String>,
    },
    Status {
        state: TaskState,
        message: Option<String>,
    },
}

/// The explicit parts of `message` when it is made of them only and holds at least one
/// `infer`, `error` or `status` part; `None` otherwise (a plain message goes to the model
/// loop, a message of tool calls only to `run_direct`).
pub(super) fn explicit_parts(message: Option<&Message>) -> Option<Vec<Explicit>> {
    let message = message?;
    let mut items = Vec::with_capacity(message.parts.len());
    for (index, part) in message.parts.iter().enumerate() {
        items.push(match &part.content {
            PartContent::ToolCall {
                call_id,
                tool_name,
                args,
            } => Explicit::Call(ToolCall {
                id: call_id.clone(),
                name: tool_name.clone(),
                arguments: args.clone(),
            }),
            PartContent::Infer {
                prompt,
                output_schema,
                ..
            } => Explicit::Infer {
                key: format!("{}:{index}", message.message_id.as_str()),
                prompt: prompt.clone(),
                output_schema: output_schema.clone(),
            },
            PartContent::Error { message, code, .. } => Explicit::Error {
                message: message.clone(),
                code: code.clone(),
            },
            PartContent::Status { state, message } => Explicit::Status {
                state: *state,
                message: message.clone(),
            },
            _ => return None,
        });
    }
    items
        .iter()
        .any(|item| !matches!(item, Explicit::Call(_)))
        .then_some(items)
}

impl RunLoop<'_> {
    /// Run `items` in order; the first that does not succeed decides how the task ends,
    /// otherwise it completes with their outputs.
    pub(super) async fn run_explicit(&mut self, items: Vec<Explicit>) -> AgentResult<Outcome> {
        let mut outputs = Vec::new();
        for item in items {
            match item {
                Explicit::Call(call) => match self.run_direct(vec![call]).await? {
                    Outcome::Answer { text, .. } => outputs.push(text),
                    other => return Ok(other),
                },
                Explicit::Infer {
                    key,
                    prompt,
                    output_schema,
                } => {
                    let Some(prompt) = prompt.filter(|p| !p.trim().is_empty()) else {
                        return Ok(Outcome::Failed {
                            error: AgentError::invalid_input(
                                "infer.prompt",
                                "an infer part needs a prompt",
                            ),
                            reason: "invalid_infer".into(),
                        });
                    };
                    match self.run_infer(&key, prompt, output_schema).await? {
                        Ok(text) => outputs.push(text),
                        Err(outcome) => return Ok(outcome),
                    }
                }
                Explicit::Error { message, code } => {
                    let reason = match code {
                        Some(code) => format!("{code}: {message}"),
                        None => message,
                    };
                    return Ok(Outcome::Failed {
                        error: AgentError::invalid_input("error part", reason),
                        reason: "error_part".into(),
                    });
                }
                Explicit::Status { state, message } => match state {
                    TaskState::InputRequired | TaskState::AuthRequired => {
                        return Ok(Outcome::InputRequired {
                            question: message.unwrap_or_default(),
                        })
                    }
                    TaskState::Failed | TaskState::Rejected => {
                        return Ok(Outcome::Failed {
                            error: AgentError::invalid_input(
                                "status part",
                                message.unwrap_or_else(|| format!("{} requested", state.as_str())),
                            ),
                            reason: "status_part".into(),
                        })
                    }
                    TaskState::Canceled => {
                        return Ok(Outcome::Canceled {
                            reason: message.unwrap_or_else(|| "status part".into()),
                        })
                    }
                    // Working, completed and unspecified ask for nothing: the other parts
                    // decide.
                    _ => {}
                },
            }
        }
        Ok(Outcome::Answer {
            text: outputs.join("\n"),
            reason: "explicit_parts",
            logged: AnswerLog::Unwritten,
        })
    }

    /// One `infer` part: the agent's instructions and `prompt`, no tools and no thread
    /// history, and the output checked against `output_schema` when given. The prompt and
    /// the answer join the thread history, and an `infer_output` part the task's log.
    /// `Err` carries how the run ends when the model fails or breaks the schema.
    async fn run_infer(
        &mut self,
        key: &str,
        prompt: String,
        output_schema: Option<Value>,
    ) -> AgentResult<Result<String, Outcome>> {
        let done = self.history.iter().find(|m| {
            m.role == LlmRole::Assistant && m.metadata.get(META_INFER) == Some(&json!(key))
        });
        if let Some(done) = done {
            return Ok(Ok(done.content.clone()));
        }
        // An `infer` part is a step of the run as each of the loop's model calls is, and
        // goes through the same checkpoints: the step check, the call's, the output check.
        let step = self.next_step();
        if let Err(outcome) = self.begin_step(step).await {
            return Ok(Err(outcome));
        }
        let inner = self.inner;
        let agent = &inner.agent;
        let llm = inner.model();
        let profile = llm.profile();
        let mut messages = Vec::with_capacity(2);
        if !agent.instructions().is_empty() {
            messages.push(LlmMessage::system(self.system_prompt().await));
        }
        messages.push(LlmMessage::user(prompt.clone()));
        let mut request = LlmRequest::new(messages);
        if let Some(schema) = &output_schema {
            request = request.with_output_schema(schema.clone());
        }
        let manifest = prepare_manifest(
            &request,
            &profile,
            ManifestIds::from_run_context(&self.ctx.run, Some(&agent.card().name)),
        );
        let site = CallSite::new(llm.as_ref(), &profile, step);
        let response = match self.model_call(&site, &manifest, request).await {
            Ok(response) => response,
            Err(outcome) => return Ok(Err(outcome)),
        };
        let content = response.content.unwrap_or_default();
        let output = match &output_schema {
            None => Value::String(content.clone()),
            Some(schema) => match structured_output(&content, schema) {
                Ok(value) => value,
                Err(reason) => {
                    return Ok(Err(Outcome::Failed {
                        error: AgentError::llm(llm.model_name(), reason),
                        reason: "invalid_infer_output".into(),
                    }))
                }
            },
        };
        let mut asked = LlmMessage::user(prompt);
        let mut answered = LlmMessage::assistant(render(&output), vec![]);
        for entry in [&mut asked, &mut answered] {
            tag(entry, &self.task.id);
            entry.metadata.insert(META_INFER.into(), json!(key));
        }
        let text = answered.content.clone();
        self.persist_point(vec![asked, answered], vec![Part::infer_output(output)])
            .await?;
        if let Err(outcome) = self.output_checkpoint().await {
            return Ok(Err(outcome));
        }
        Ok(Ok(text))
    }
}

/// The model's answer read as JSON that `schema` accepts; a fenced code block around it is
/// taken off first, since models add one even when asked not to.
fn structured_output(content: &str, schema: &Value) -> Result<Value, String> {
    let trimmed = content.trim();
    let unfenced = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .unwrap_or(trimmed)
        .trim();
    let value: Value = serde_json::from_str(unfenced)
        .map_err(|e| format!("the inference's output is not JSON: {e}"))?;
    let validator = jsonschema::validator_for(schema)
        .map_err(|e| format!("the infer part's output schema is invalid: {e}"))?;
    if let Some(error) = validator.iter_errors(&value).next() {
        return Err(format!(
            "the inference's output does not follow its schema: {error}"
        ));
    }
    Ok(value)
}

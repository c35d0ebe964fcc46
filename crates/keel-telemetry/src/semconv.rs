//! The names Keel's spans use, from the OpenTelemetry GenAI semantic conventions: one place
//! for every attribute and span name, so a convention change touches this module only.

/// The GenAI conventions these names follow: the `semantic-conventions-genai` release.
pub const GENAI_CONVENTIONS: &str = "semantic-conventions-genai 0.1.0";

/// The instrumentation scope of Keel's spans.
pub const SCOPE: &str = "keel";

/// `gen_ai.operation.name`: `invoke_agent`, `chat` or `execute_tool`.
pub const OPERATION_NAME: &str = "gen_ai.operation.name";
/// `gen_ai.provider.name`: the model's provider (`openai`, `anthropic`, ...).
pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
/// `gen_ai.request.model`: the model asked for.
pub const REQUEST_MODEL: &str = "gen_ai.request.model";
/// `gen_ai.response.model`: the model that answered.
pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
/// `gen_ai.usage.input_tokens`.
pub const USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
/// `gen_ai.usage.output_tokens`.
pub const USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
/// `gen_ai.response.finish_reasons`: an array of strings.
pub const RESPONSE_FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
/// `gen_ai.tool.name`.
pub const TOOL_NAME: &str = "gen_ai.tool.name";
/// `gen_ai.tool.call.id`: the model's id of the call.
pub const TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
/// `gen_ai.tool.type`: Keel's tools are `function`s.
pub const TOOL_TYPE: &str = "gen_ai.tool.type";
/// `gen_ai.tool.description`.
pub const TOOL_DESCRIPTION: &str = "gen_ai.tool.description";
/// `gen_ai.tool.call.arguments` (content: only when opted in).
pub const TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
/// `gen_ai.tool.call.result` (content: only when opted in).
pub const TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";
/// `gen_ai.output.messages` (content: only when opted in).
pub const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
/// `gen_ai.agent.name`.
pub const AGENT_NAME: &str = "gen_ai.agent.name";
/// `gen_ai.conversation.id`: Keel's thread.
pub const CONVERSATION_ID: &str = "gen_ai.conversation.id";
/// `error.type`: why an operation failed.
pub const ERROR_TYPE: &str = "error.type";

/// `invoke_agent`: a run.
pub const OP_INVOKE_AGENT: &str = "invoke_agent";
/// `chat`: a model call.
pub const OP_CHAT: &str = "chat";
/// `execute_tool`: a tool call.
pub const OP_EXECUTE_TOOL: &str = "execute_tool";

/// `keel.run.id`.
pub const KEEL_RUN_ID: &str = "keel.run.id";
/// `keel.task.id`.
pub const KEEL_TASK_ID: &str = "keel.task.id";
/// `keel.thread.id`.
pub const KEEL_THREAD_ID: &str = "keel.thread.id";
/// `keel.step`: a step's number, from 1.
pub const KEEL_STEP: &str = "keel.step";
/// `keel.action.id`: a tool call's action.
pub const KEEL_ACTION_ID: &str = "keel.action.id";
/// `keel.delegation.id`: the delegation a run serves.
pub const KEEL_DELEGATION_ID: &str = "keel.delegation.id";
/// `keel.run.state`: the state a run rested or ended in.
pub const KEEL_RUN_STATE: &str = "keel.run.state";
/// `keel.stop.reason`: why the run stopped.
pub const KEEL_STOP_REASON: &str = "keel.stop.reason";
/// `keel.resumes`: on a span that goes on from an earlier one (a run or a tool call resumed
/// after a rest or a crash), the earlier span's id, which its link names too (decision 239).
pub const KEEL_RESUMES: &str = "keel.resumes";
/// `keel.link.type`: on that link, what the linked span is to this one (`resumes`).
pub const KEEL_LINK_TYPE: &str = "keel.link.type";

/// The span event of a policy decision on a tool call (`action.policy`).
pub const EVENT_POLICY: &str = "keel.policy.decision";
/// The span event of an approval asked for (`approval.required`).
pub const EVENT_APPROVAL_REQUIRED: &str = "keel.approval.required";
/// The span event of an approver's decision (`approval.decided`).
pub const EVENT_APPROVAL_DECIDED: &str = "keel.approval.decided";
/// `keel.policy.decision`: `allow`, `deny` or `require_approval`.
pub const KEEL_POLICY_DECISION: &str = "keel.policy.decision";
/// `keel.policy.reason`.
pub const KEEL_POLICY_REASON: &str = "keel.policy.reason";
/// `keel.approval.outcome`: the approver's decision.
pub const KEEL_APPROVAL_OUTCOME: &str = "keel.approval.outcome";

/// The environment variable that opts in to prompt and completion content on spans (the name
/// OpenTelemetry's GenAI instrumentations read).
pub const CAPTURE_CONTENT_VAR: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";

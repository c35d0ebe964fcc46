//! Sample values with every kind of part, message, artifact, task and card, for the wire
//! module's round-trip tests.

use keel_core::{
    ActionId, AgentCard, AgentRole, AgentSkill, ApprovalDecision, ApprovalOutcome, ApprovalRequest,
    Artifact, FileContent, Message, Part, PartContent, RunAction, RunBudget, RunContext,
    SecurityScheme, Task, TaskId, TaskState, ThreadId, TransportKind,
};
use serde_json::json;

pub(super) fn every_part() -> Vec<Part> {
    let mut with_meta = Part::text("with metadata");
    with_meta.metadata.insert("lang".into(), json!("en"));
    let mut typed_with_meta = Part::tool_call("c9", "add", json!({"a": 1}));
    typed_with_meta
        .metadata
        .insert("origin".into(), json!({"step": 2}));
    vec![
        Part::text("t"),
        with_meta,
        Part::file(FileContent {
            name: Some("a.txt".into()),
            media_type: Some("text/plain".into()),
            uri: None,
            bytes: Some("aGk=".into()),
        }),
        Part::file(FileContent {
            name: None,
            media_type: Some("image/png".into()),
            uri: Some("https://example.com/a.png".into()),
            bytes: None,
        }),
        // A2A cannot hold these file parts as raw/url parts; they travel typed.
        Part::file(FileContent {
            name: Some("both".into()),
            media_type: None,
            uri: Some("https://example.com/b".into()),
            bytes: Some("aGk=".into()),
        }),
        Part::file(FileContent {
            name: None,
            media_type: None,
            uri: None,
            bytes: Some("aGk".into()),
        }),
        Part::file(FileContent::default()),
        Part::data(json!({"x": [1, 2]})),
        Part::data(json!("a bare string")),
        Part::json(json!({"ok": true})),
        Part::json(json!([1, "two"])),
        Part::tool_call("c1", "add", json!({"a": 1})),
        typed_with_meta,
        Part::tool_output("c1", "add", json!(2), false),
        Part::tool_output("c2", "add", json!("boom"), true),
        Part::infer("who are you?"),
        PartContent::Infer {
            prompt: None,
            user: Some("u".into()),
            output_schema: Some(json!({"type": "string"})),
        }
        .into(),
        Part::infer_output(json!("a bot")),
        Part::error("boom"),
        PartContent::Error {
            message: "bad".into(),
            code: Some("E1".into()),
            details: Some(json!({"line": 3})),
        }
        .into(),
        Part::status(TaskState::InputRequired, Some("which city?".into())),
        Part::route("quality", Some("ready".into())),
        Part::decision("approve", None),
    ]
}

pub(super) fn through_wire_json<T: serde::Serialize + serde::de::DeserializeOwned>(value: T) -> T {
    serde_json::from_value(serde_json::to_value(value).unwrap()).unwrap()
}

pub(super) fn full_message() -> Message {
    let mut message = Message::user("hi").in_thread("th-1");
    for part in every_part() {
        message = message.with_part(part);
    }
    message.task_id = Some(TaskId::from("t-1"));
    message.reference_task_ids = vec![TaskId::from("t-0")];
    message.metadata.insert("k".into(), json!({"nested": [1]}));
    message
}

pub(super) fn full_artifact() -> Artifact {
    let mut artifact = Artifact::text("report")
        .named("analysis")
        .of_kind("diagnostic")
        .for_action(ActionId::from("a-1"))
        .with_part(Part::json(json!({"score": 3})));
    artifact.description = Some("the report".into());
    artifact.uri = Some("file:///tmp/report.json".into());
    artifact.media_type = Some("application/json".into());
    artifact.metadata.insert("k".into(), json!(true));
    artifact
}

pub(super) fn tasks() -> Vec<Task> {
    let submitted = Task::create(Message::user("hi"));
    let mut completed = Task::create(full_message());
    completed.add_artifact(full_artifact());
    completed.metadata.insert("k".into(), json!([1, 2]));
    RunContext::ensure_task_context(&mut completed).unwrap();
    completed.complete("done").unwrap();
    let mut canceled = Task::new(ThreadId::from("th-9"));
    canceled.begin().unwrap();
    canceled.cancel(Some("user asked")).unwrap();
    let mut waiting = Task::new(ThreadId::new());
    waiting
        .require_input(Some(Message::agent("which city?")))
        .unwrap();
    vec![
        submitted,
        completed,
        canceled,
        waiting,
        waiting_for_approval(),
    ]
}

/// A task a caller sent a run context for, waiting for an approval (with a preview), with
/// every key the engine writes and a caller's own keys beside them.
pub(super) fn waiting_for_approval() -> Task {
    let mut task = Task::create(Message::user("write it"));
    let mut ctx = RunContext::new()
        .with_agent("gateway")
        .with_budget(RunBudget {
            max_steps: Some(8),
            max_llm_calls: Some(4),
            ..Default::default()
        });
    ctx.workspace_uri = Some("file:///workspace".into());
    ctx.permissions
        .insert("records.write".into(), json!("require_approval"));
    ctx.metadata
        .insert("app_key".into(), json!({"inner_key": 1}));
    ctx.attach_to_task(&mut task).unwrap();
    task.begin().unwrap();
    task.require_input(Some(Message::agent("approve write_record?")))
        .unwrap();
    let mut action = RunAction::tool_call("write_record", json!({"record_id": "r1"}));
    action.description = Some("Write a record".into());
    action.capabilities = vec!["records.write".into()];
    action.previews = vec![Artifact::text("the row")
        .named("preview")
        .of_kind("preview")];
    action.metadata.insert("call_id".into(), json!("call-1"));
    let request = ApprovalRequest {
        request_id: "req-1".into(),
        action,
        reason: "policy asks".into(),
        run_id: Some(ctx.run_id.clone()),
        requested_at: chrono::Utc::now(),
    };
    let decision = ApprovalDecision {
        request_id: "req-1".into(),
        outcome: ApprovalOutcome::Approved,
        reason: Some("checked".into()),
        decided_by: Some("default-user".into()),
        decided_at: chrono::Utc::now(),
    };
    for (key, value) in [
        ("pending_approval", serde_json::to_value(&request).unwrap()),
        ("approval_decision", serde_json::to_value(decision).unwrap()),
        ("stop_reason", json!("approval_required")),
        ("awaiting_tool_call", json!("acall-1")),
        ("skill", json!("records")),
        ("agent", json!("writer")),
        ("my_key", json!({"nested_key": true})),
        ("session_id", json!("legacy-session")),
    ] {
        task.metadata.insert(key.into(), value);
    }
    task
}

/// `task` as a caller reads it back from the wire: without the engine's bookkeeping keys.
pub(super) fn as_sent(mut task: Task) -> Task {
    for key in super::task_meta::INTERNAL_KEYS {
        task.metadata.remove(key);
    }
    task
}

pub(super) fn full_card() -> AgentCard {
    let mut card = AgentCard::new("weather", "Weather service", "http://127.0.0.1:9/")
        .with_skill(
            AgentSkill::new("forecast", "Forecast for a city")
                .with_tags(["weather"])
                .with_example("Athens tomorrow?")
                .with_input_schema(json!({"type": "object"}))
                .with_output_schema(json!({"type": "string"})),
        )
        .with_skill(AgentSkill::new("plain", "No schemas"))
        .with_tags(["finance"]);
    card.role = AgentRole::Orchestrator;
    card.transport = TransportKind::Websocket;
    card.version = "2.1.0".into();
    card.input_formats = vec!["text/plain".into(), "application/json".into()];
    card.capabilities.tool_calling = true;
    card.capabilities.max_concurrency = 4;
    card.security_schemes.insert(
        "key".into(),
        SecurityScheme::ApiKey {
            location: "header".into(),
            name: "X-Api-Key".into(),
            description: Some("the key".into()),
        },
    );
    card.security_schemes.insert(
        "bearer".into(),
        SecurityScheme::Http {
            scheme: "bearer".into(),
            bearer_format: Some("JWT".into()),
            description: None,
        },
    );
    card.security_schemes.insert(
        "oauth".into(),
        SecurityScheme::OAuth2 {
            flows: json!({"clientCredentials": {"tokenUrl": "https://x/token", "scopes": {"read": "Read"}}}),
            description: None,
        },
    );
    card.security_schemes.insert(
        "oidc".into(),
        SecurityScheme::OpenIdConnect {
            open_id_connect_url: "https://x/.well-known/openid-configuration".into(),
            description: None,
        },
    );
    card.security_schemes.insert(
        "mtls".into(),
        SecurityScheme::MutualTls { description: None },
    );
    card
}

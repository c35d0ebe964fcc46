//! The loader's checks, the template, and the field reference in docs/config.md.

use std::collections::BTreeSet;
use std::sync::Arc;

use keel_core::{Message, TaskState};
use keel_runtime::Runtime;

use super::*;
use crate::DefaultRuntime;

fn parse(text: &str) -> Result<LoadedConfig, ConfigError> {
    Config::parse(text, "keel.toml")
}

/// The error `text` is refused with, which must point at `line` and `column`.
fn error_at(text: &str, line: usize, column: usize) -> ConfigError {
    let error = parse(text).unwrap_err();
    assert_eq!(
        (error.line, error.column),
        (Some(line), Some(column)),
        "{error}"
    );
    error
}

const MINIMAL: &str = "[[agents]]\nname = \"a\"\ndescription = \"A.\"\n";

/// A tool `name` that takes any object and answers what `answer` answers.
fn object_tool<F, Fut>(name: &str, answer: F) -> keel_agent::FnTool
where
    F: Fn(serde_json::Value, keel_agent::ToolContext) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = keel_core::AgentResult<serde_json::Value>> + Send + 'static,
{
    keel_agent::FnTool::new(
        name,
        "A test tool.",
        serde_json::json!({"type": "object"}),
        answer,
    )
}

/// The agents of `config` on an offline runtime, `tool` added to agent `owner`, and the task
/// of `text` sent to the default agent, once it rests.
async fn ask_default_agent(
    config: &LoadedConfig,
    owner: &str,
    tool: impl keel_agent::Tool + 'static,
    text: &str,
) -> (AgentSet, keel_core::Task) {
    let runtime: Arc<dyn Runtime> = Arc::new(DefaultRuntime::offline());
    let agents = config
        .agents()
        .tool(owner, tool)
        .build(runtime.clone())
        .unwrap();
    let auth = runtime.auth_service().auth_context();
    let task = agents
        .default_agent()
        .executor
        .send_message(&auth, Message::user(text), Default::default())
        .await
        .unwrap();
    (agents, task)
}

#[test]
fn the_template_loads_and_declares_two_agents() {
    let config = parse(TEMPLATE).unwrap();
    let names: Vec<&str> = config.agents.iter().map(AgentConfig::name).collect();
    assert_eq!(names, ["assistant", "researcher"]);
    assert_eq!(config.default_agent().name(), "assistant");
}

#[test]
fn an_unknown_key_names_its_line_column_field_and_the_key_meant() {
    let text = "[[agents]]\nname = \"a\"\ndescription = \"A.\"\n\n[agents.model]\nid = \"mock\"\ntemprature = 0.5\n";
    let error = error_at(text, 7, 1);
    assert_eq!(error.field, "agents[0].model.temprature");
    assert!(
        error.message.contains("unknown field `temprature`"),
        "{error}"
    );
    assert_eq!(error.suggestion.as_deref(), Some("temperature"));
    let shown = error.to_string();
    assert!(
        shown.starts_with("keel.toml:7:1: agents[0].model.temprature: unknown field"),
        "{shown}"
    );
    assert!(shown.contains("did you mean `temperature`?"), "{shown}");
}

#[test]
fn a_value_of_the_wrong_type_names_the_field_and_what_was_expected() {
    let text = format!("[server]\nport = \"eighty\"\n\n{MINIMAL}");
    let error = error_at(&text, 2, 8);
    assert_eq!(error.field, "server.port");
    assert!(error.message.contains("expected u16"), "{error}");
}

#[test]
fn a_drain_timeout_out_of_range_names_the_field_and_the_range() {
    let text = format!("[server]\ndrain_timeout_seconds = -1\n\n{MINIMAL}");
    let error = parse(&text).unwrap_err();
    assert_eq!(error.field, "server.drain_timeout_seconds");
    assert_eq!(error.message, "use 0 to 3600 seconds", "{error}");
    let text = format!("[server]\ndrain_timeout_seconds = 2.5\n\n{MINIMAL}");
    assert_eq!(parse(&text).unwrap().server.drain_timeout_seconds, 2.5);
}

#[test]
fn a_misspelt_rule_value_is_suggested() {
    let text = format!("{MINIMAL}[agents.policy]\ndefault = \"alow\"\n");
    let error = parse(&text).unwrap_err();
    assert_eq!(error.line, Some(5), "{error}");
    assert_eq!(error.suggestion.as_deref(), Some("allow"), "{error}");
}

#[test]
fn every_missing_environment_variable_is_named_at_once() {
    let text = format!(
        "[[server.api_keys]]\nkey = \"${{KEEL_TEST_UNSET_ONE}}\"\ntenant = \"a/b\"\n\n\
         [[server.api_keys]]\nkey = \"${{KEEL_TEST_UNSET_TWO}}-${{KEEL_TEST_UNSET_THREE}}\"\ntenant = \"c/d\"\n\n{MINIMAL}"
    );
    let error = error_at(&text, 2, 7);
    assert!(
        error.message.contains("`KEEL_TEST_UNSET_ONE` is not set"),
        "{error}"
    );
    assert!(
        error.message.contains(
            "also not set: `KEEL_TEST_UNSET_TWO` (server.api_keys[1].key), `KEEL_TEST_UNSET_THREE` (server.api_keys[1].key)"
        ),
        "{error}"
    );
}

#[test]
fn a_missing_environment_variable_is_an_error_at_its_value() {
    let text = format!(
        "[[server.api_keys]]\nkey = \"${{KEEL_TEST_SURELY_UNSET_VAR}}\"\ntenant = \"a/b\"\n\n{MINIMAL}"
    );
    let error = error_at(&text, 2, 7);
    assert!(
        error
            .message
            .contains("`KEEL_TEST_SURELY_UNSET_VAR` is not set"),
        "{error}"
    );
}

#[test]
fn references_between_agents_are_checked_with_suggestions() {
    let text = "[[agents]]\nname = \"boss\"\ndescription = \"B.\"\n[[agents.subagents]]\nagent = \"helpr\"\n\n[[agents]]\nname = \"helper\"\ndescription = \"H.\"\n";
    let error = error_at(text, 5, 9);
    assert_eq!(error.field, "agents[0].subagents[0].agent");
    assert_eq!(error.suggestion.as_deref(), Some("helper"));

    let text = format!("[server]\ndefault_agent = \"b\"\n\n{MINIMAL}");
    let error = parse(&text).unwrap_err();
    assert_eq!(error.line, Some(2), "{error}");

    let twice = format!("{MINIMAL}{MINIMAL}");
    assert!(parse(&twice)
        .unwrap_err()
        .message
        .contains("names two agents"));

    let circle = "[[agents]]\nname = \"a\"\ndescription = \"A.\"\n[[agents.subagents]]\nagent = \"b\"\n[[agents]]\nname = \"b\"\ndescription = \"B.\"\n[[agents.subagents]]\nagent = \"a\"\n";
    let error = parse(circle).unwrap_err();
    assert!(error.message.contains("a -> b -> a"), "{error}");

    let bad_name = "[[agents]]\nname = \"a/b\"\ndescription = \"A.\"\n";
    assert!(parse(bad_name).unwrap_err().message.contains("URL path"));
    assert!(parse("agents = []\n").is_err());
}

#[test]
fn a_bad_model_id_is_an_error_at_the_id() {
    let text = format!("{MINIMAL}[agents.model]\nid = \"parrot:polly\"\n");
    let error = error_at(&text, 5, 6);
    assert!(error.message.contains("unknown model kind"), "{error}");
}

#[test]
fn instructions_come_from_a_file_next_to_the_config() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("prompt.md"), "Be terse.").unwrap();
    let path = dir.path().join("keel.toml");
    std::fs::write(
        &path,
        "[[agents]]\nname = \"a\"\ndescription = \"A.\"\ninstructions_file = \"prompt.md\"\n",
    )
    .unwrap();
    let config = Config::from_path(&path).unwrap();
    assert_eq!(config.instructions_of(&config.agents[0]), "Be terse.");

    std::fs::write(
        &path,
        "[[agents]]\nname = \"a\"\ndescription = \"A.\"\ninstructions_file = \"nope.md\"\n",
    )
    .unwrap();
    let error = Config::from_path(&path).unwrap_err();
    assert_eq!(error.line, Some(4), "{error}");
    assert!(error.message.contains("cannot read"), "{error}");
}

#[tokio::test]
async fn agents_are_built_with_their_tools_policy_budget_and_subagents() {
    let config = parse(TEMPLATE).unwrap();
    let extra = object_tool("shout", |_args, _ctx| async {
        Ok(serde_json::json!("HEY"))
    });
    // The default agent answers a message offline.
    let (agents, task) = ask_default_agent(&config, "researcher", extra, "hi").await;
    assert_eq!(task.state(), TaskState::Completed);
    let assistant = agents.get("assistant").unwrap().executor.agent();
    let tools: BTreeSet<String> = assistant.tool_specs().into_iter().map(|t| t.name).collect();
    for name in [
        "weather",
        "translator",
        "ask_human",
        "session_stop",
        "session_fail",
        "subagent_create",
    ] {
        assert!(tools.contains(name), "{name} missing from {tools:?}");
    }
    assert_eq!(assistant.budget().max_tool_calls, Some(40));
    assert_eq!(assistant.card().skills[0].name, "Answer");
    let researcher = agents.get("researcher").unwrap().executor.agent();
    let tools: Vec<String> = researcher
        .tool_specs()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert!(tools.contains(&"shout".to_owned()) && tools.contains(&"session_status".to_owned()));

    let unknown = config
        .agents()
        .tool("nobody", keel_agent::SessionStatusTool)
        .build(Arc::new(DefaultRuntime::offline()));
    assert!(unknown.is_err());
}

#[tokio::test]
async fn the_agent_budget_bounds_every_run() {
    let text = format!("{MINIMAL}[agents.budget]\nmax_tool_calls = 0\n");
    let config = parse(&text).unwrap();
    let shout = object_tool("shout", |_args, _ctx| async {
        Ok(serde_json::json!("HEY"))
    });
    let (_, task) = ask_default_agent(&config, "a", shout, "/shout {}").await;
    assert_eq!(task.state(), TaskState::Failed, "{task:?}");
}

#[test]
fn a_cost_limit_needs_a_priced_model_and_prices_are_dollars_zero_or_more() {
    let text = format!("{MINIMAL}[agents.budget]\nmax_cost = 0.5\n");
    let error = parse(&text).unwrap_err();
    assert_eq!(error.field, "agents[0].budget.max_cost", "{error}");
    assert!(error.message.contains("`mock` has no price"), "{error}");
    let text = format!("[prices.mock]\ninput = -1\noutput = 1\n{MINIMAL}");
    assert_eq!(parse(&text).unwrap_err().field, "prices.\"mock\"");
    let text = format!(
        "[prices.mock]\ninput = 1\noutput = 1\n{MINIMAL}[agents.budget]\nmax_cost = -0.5\n"
    );
    assert_eq!(parse(&text).unwrap_err().field, "agents[0].budget.max_cost");
}

#[tokio::test]
async fn the_agent_s_max_cost_stops_a_run_at_its_model_s_price() {
    // One micro-dollar: the first call's estimate alone passes it.
    let text = format!(
        "[prices.mock]\ninput = 1.0\noutput = 2.0\n{MINIMAL}[agents.budget]\nmax_cost = 0.000001\n"
    );
    let config = parse(&text).unwrap();
    let shout = object_tool("shout", |_args, _ctx| async {
        Ok(serde_json::json!("HEY"))
    });
    let (_, task) = ask_default_agent(&config, "a", shout, "/shout {}").await;
    assert_eq!(task.state(), TaskState::Failed, "{task:?}");
    assert_eq!(task.metadata["stop_reason"], "max_cost_micros");
}

#[tokio::test]
async fn a_denied_capability_never_runs() {
    let text = format!("{MINIMAL}[agents.policy]\ndeny = [\"net.*\"]\n");
    let config = parse(&text).unwrap();
    let ran = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = ran.clone();
    let fetch = object_tool("fetch", move |_args, _ctx| {
        seen.store(true, std::sync::atomic::Ordering::SeqCst);
        async { Ok(serde_json::json!("fetched")) }
    })
    .with_capabilities(["net.fetch"]);
    ask_default_agent(&config, "a", fetch, "/fetch {}").await;
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
}

/// Every field of every table, as `serde` knows them: each table of the template (plus the
/// tables the template leaves commented) gets an unknown key, and the loader's error lists
/// the fields it expected there.
fn fields_from_types() -> BTreeSet<String> {
    // The optional tables the template leaves out; `NAME` and `TOOL` stand for the names the
    // docs write that way.
    let full = format!(
        "{TEMPLATE}\n[[server.api_keys]]\nkey = \"k\"\ntenant = \"a/b\"\n\
         [mcp.NAME]\ncommand = \"server\"\n[mcp.NAME.tools.TOOL]\n\
         [prices.MODEL]\ninput = 1\noutput = 1\n"
    );
    let document: toml::Table = toml::from_str(&full).unwrap();
    let mut tables = Vec::new();
    collect_tables(&document, &mut Vec::new(), &mut tables);
    let mut fields = BTreeSet::new();
    for (probe_path, shown) in tables {
        let mut probed = document.clone();
        let table = table_at(&mut probed, &probe_path);
        table.insert("zz_probe".into(), toml::Value::Integer(0));
        let Err(error) = parse(&toml::to_string(&probed).unwrap()) else {
            continue; // a free-form table (JSON schema)
        };
        let Some((_, expected)) = error::unknown_name(&error.message) else {
            continue; // a map (headers): any key is a value of the wrong type
        };
        for name in expected {
            fields.insert(if shown.is_empty() {
                name.to_owned()
            } else {
                format!("{shown}.{name}")
            });
        }
    }
    fields
}

/// Each table's path (keys, and index 0 of arrays of tables) and how the docs write it.
fn collect_tables(
    table: &toml::Table,
    path: &mut Vec<String>,
    out: &mut Vec<(Vec<String>, String)>,
) {
    out.push((path.clone(), shown(path)));
    for (key, value) in table {
        match value {
            toml::Value::Table(inner) => {
                path.push(key.clone());
                collect_tables(inner, path, out);
                path.pop();
            }
            toml::Value::Array(items) => {
                if let Some(toml::Value::Table(inner)) = items.first() {
                    path.push(format!("{key}[]"));
                    collect_tables(inner, path, out);
                    path.pop();
                }
            }
            _ => {}
        }
    }
}

fn shown(path: &[String]) -> String {
    path.join(".")
}

fn table_at<'a>(table: &'a mut toml::Table, path: &[String]) -> &'a mut toml::Table {
    let Some((first, rest)) = path.split_first() else {
        return table;
    };
    let next = match first.strip_suffix("[]") {
        Some(key) => match table.get_mut(key) {
            Some(toml::Value::Array(items)) => items[0].as_table_mut().unwrap(),
            _ => unreachable!("collected from the same document"),
        },
        None => table
            .get_mut(first.as_str())
            .unwrap()
            .as_table_mut()
            .unwrap(),
    };
    table_at(next, rest)
}

/// The fields docs/config.md lists: the first cell of each reference row, `` `a.b` ``.
fn fields_from_docs() -> BTreeSet<String> {
    let docs = include_str!("../../../../docs/config.md");
    docs.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(field, _)| field.to_owned()))
        .collect()
}

#[test]
fn the_reference_in_the_docs_lists_every_field_and_no_other() {
    let from_types = fields_from_types();
    let from_docs = fields_from_docs();
    let undocumented: Vec<_> = from_types.difference(&from_docs).collect();
    let stale: Vec<_> = from_docs.difference(&from_types).collect();
    assert!(
        undocumented.is_empty() && stale.is_empty(),
        "docs/config.md is out of step with the config types: undocumented {undocumented:?}, \
         not a field {stale:?}"
    );
    assert!(from_types.contains("agents[].tools.http[].timeout_seconds"));
}

#[tokio::test]
async fn an_action_needing_approval_waits_and_the_stop_rules_are_the_files() {
    let text = format!(
        "{MINIMAL}[agents.policy]\nrequire_approval = [\"mail.*\"]\n[agents.stop]\nmax_steps = 4\nstop_on_response = true\nmax_session_turns = 9\n"
    );
    let config = parse(&text).unwrap();
    let runtime: Arc<dyn Runtime> = Arc::new(DefaultRuntime::offline());
    let send = keel_agent::FnTool::new(
        "send_mail",
        "Send mail.",
        serde_json::json!({"type": "object"}),
        |_args, _ctx| async { Ok(serde_json::json!("sent")) },
    )
    .with_capabilities(["mail.send"]);
    let agents = config
        .agents()
        .tool("a", send)
        .build(runtime.clone())
        .unwrap();
    let executor = &agents.default_agent().executor;
    let stop = executor.agent().stop_rules();
    assert_eq!((stop.max_steps, stop.max_session_turns), (4, Some(9)));
    let auth = runtime.auth_service().auth_context();
    let task = executor
        .send_message(&auth, Message::user("/send_mail {}"), Default::default())
        .await
        .unwrap();
    assert_eq!(task.state(), TaskState::InputRequired, "{task:?}");
}

#[test]
fn tool_names_and_schemas_are_checked_where_they_are_written() {
    let tool = |name: &str, parameters: &str| {
        format!("[[agents.tools.http]]\nname = \"{name}\"\ndescription = \"T.\"\nurl = \"http://127.0.0.1:9/\"\nparameters = {parameters}\n")
    };
    let twice = format!("{MINIMAL}{}{}", tool("t", "{}"), tool("t", "{}"));
    let error = error_at(&twice, 10, 8);
    assert_eq!(error.field, "agents[0].tools.http[1].name");
    let reserved = format!("{MINIMAL}{}", tool("ask_human", "{}"));
    assert!(parse(&reserved)
        .unwrap_err()
        .message
        .contains("already has a tool"));
    let bad_schema = format!("{MINIMAL}{}", tool("t", "{ type = \"thing\" }"));
    let error = error_at(&bad_schema, 8, 14);
    assert!(error.message.contains("not a valid JSON schema"), "{error}");
}

#[test]
fn an_agent_compacts_automatically_as_its_file_says() {
    let text = format!(
        "{MINIMAL}[agents.compaction]\nstrategy = \"recent\"\nmax_messages = 8\ncontext_window = 4000\n"
    );
    let config = parse(&text).unwrap();
    let agents = config
        .agents()
        .build(Arc::new(DefaultRuntime::offline()))
        .unwrap();
    let compaction = agents
        .default_agent()
        .executor
        .agent()
        .compaction()
        .cloned()
        .expect("the agent compacts");
    let engine_default = keel_agent::AutoCompaction::new(keel_llm::CompactionStrategy::Recent);
    assert_eq!(
        compaction,
        keel_agent::AutoCompaction {
            max_messages: 8,
            context_window: Some(4000),
            ..engine_default
        }
    );
    // Without the table nothing is compacted.
    let plain = parse(MINIMAL).unwrap();
    let plain = plain
        .agents()
        .build(Arc::new(DefaultRuntime::offline()))
        .unwrap();
    assert!(plain
        .default_agent()
        .executor
        .agent()
        .compaction()
        .is_none());

    let error = parse(&format!(
        "{MINIMAL}[agents.compaction]\nstrategy = \"tokens\"\ntarget_ratio = 1.5\n"
    ))
    .unwrap_err();
    assert_eq!(error.field, "agents[0].compaction.target_ratio", "{error}");
    let error = parse(&format!(
        "{MINIMAL}[agents.compaction]\nstrategy = \"shrink\"\n"
    ))
    .unwrap_err();
    assert!(error.message.contains("recent"), "{error}");
}

#[tokio::test]
async fn an_http_tools_failure_names_the_url_it_called_and_why() {
    let refused = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unavailable = axum::Router::new().route(
        "/weather/{city}",
        axum::routing::get(|| async {
            (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "down for maintenance",
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let down = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, unavailable).await });
    for (port, said) in [
        (
            refused,
            format!("GET http://127.0.0.1:{refused}/weather/Oslo?units=metric: "),
        ),
        (
            down,
            format!(
                "GET http://127.0.0.1:{down}/weather/Oslo?units=metric answered HTTP 503: down for maintenance"
            ),
        ),
    ] {
        let text = format!(
            "{MINIMAL}[[agents.tools.http]]\nname = \"weather\"\ndescription = \"W.\"\nmethod = \"GET\"\n\
             url = \"http://127.0.0.1:{port}/weather/{{city}}\"\n\
             parameters = {{ type = \"object\", properties = {{ city = {{ type = \"string\" }} }} }}\n"
        );
        let config = parse(&text).unwrap();
        let runtime: Arc<dyn Runtime> = Arc::new(DefaultRuntime::offline());
        let agents = config.agents().build(runtime.clone()).unwrap();
        let auth = runtime.auth_service().auth_context();
        let executor = &agents.default_agent().executor;
        let task = executor
            .send_message(
                &auth,
                // `units` fills no placeholder: it goes in the query, and the error shows it.
                Message::user(r#"/weather {"city": "Oslo", "units": "metric"}"#),
                Default::default(),
            )
            .await
            .unwrap();
        let history = executor.get_task(&auth, &task.id, None).await.unwrap();
        let shown = serde_json::to_string(&history).unwrap();
        assert!(shown.contains(&said), "`{said}` not in {shown}");
        if port == refused {
            assert!(shown.to_lowercase().contains("refused"), "{shown}");
        }
    }
}

//! Agents from a file, driven as a user drives the `keel` binary: `keel init` writes a
//! `keel.toml`, `keel check` validates it and masks its secrets, `keel serve --config` serves
//! every agent under `/agents/{name}/` (the default also at `/`), and an HTTP tool declared in
//! the file is called by the agent's model. Also: the push-target allow list, a per-agent
//! model key, and the A2A JSON-RPC checks on each agent's endpoint.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::Path as UrlPath;
use axum::http::HeaderMap;
use axum::routing::get;
use keel::core::Message;
use keel::transport::A2aClient;
use serde_json::{json, Value};
use support::{card, KeelServer};

fn keel(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run keel")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A blocking JSON-RPC SendMessage to `endpoint`; the task it answers.
async fn send(endpoint: &str, words: &str) -> Value {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": format!("m-{words}"), "role": "ROLE_USER", "parts": [{"text": words}]}}
    });
    let answer: Value = support::post_rpc(endpoint, &body).await;
    answer["result"]["task"].clone()
}

fn answer_text(task: &Value) -> String {
    task["status"]["message"]["parts"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn init_then_check_then_serve_two_agents_each_with_its_own_card_and_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = dir.path().to_str().unwrap();
    let init = keel(&["init", dir_arg], &[]);
    assert!(init.status.success(), "{}", text(&init.stderr));
    let file = dir.path().join("keel.toml");
    let file_arg = file.to_str().unwrap();
    // `init` refuses to replace the file it wrote.
    assert!(!keel(&["init", dir_arg], &[]).status.success());

    let check = keel(&["check", file_arg], &[]);
    assert!(check.status.success(), "{}", text(&check.stderr));
    // `--config` names the file as it does for `serve`, `run`, `chat` and `tools`.
    let by_flag = keel(&["check", "--config", file_arg], &[]);
    assert_eq!(
        text(&by_flag.stdout),
        text(&check.stdout),
        "{}",
        text(&by_flag.stderr)
    );
    let shown = text(&check.stdout);
    for expected in [
        ": ok",
        "agent `assistant` (default, also at /): http://127.0.0.1:8080/agents/assistant/",
        "agent `researcher`: http://127.0.0.1:8080/agents/researcher/",
        "tool (http): weather GET http://127.0.0.1:9000/weather/{city}",
        "subagent: researcher",
    ] {
        assert!(shown.contains(expected), "`{expected}` not in:\n{shown}");
    }

    let server = KeelServer::start_with(&["--config", file_arg, "--store", "memory"]);
    let base = server.url.clone();
    for name in ["assistant", "researcher"] {
        let url = format!("{base}agents/{name}/");
        let card = card(&url).await;
        assert_eq!(card["name"], name, "{card}");
        let interfaces = card["supportedInterfaces"].as_array().unwrap();
        assert!(!interfaces.is_empty(), "{card}");
        for interface in interfaces {
            let at = interface["url"].as_str().unwrap();
            assert!(
                at.starts_with(url.trim_end_matches('/')),
                "{name}'s interface {at} is not under {url}"
            );
        }
        // The card decodes as an A2A v1.0 card (the SDK's own types).
        let decoded = A2aClient::new(url.clone()).get_card().await.unwrap();
        assert_eq!(decoded.name, name);
        // JSON-RPC at the agent's path, and the HTTP+JSON binding under it.
        let task = send(&url, "hello").await;
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
        assert_eq!(answer_text(&task), "You said: hello");
        let rest = A2aClient::http(url.trim_end_matches('/'))
            .send_message(Message::user("over rest"), Default::default())
            .await
            .unwrap();
        assert_eq!(rest.state(), keel::core::TaskState::Completed, "{rest:?}");
    }
    // The assistant has the `weather` tool, the researcher does not: the same words reach
    // different agents (the tool's endpoint is down, so the assistant reports its failure).
    let to_assistant = answer_text(
        &send(
            &format!("{base}agents/assistant/"),
            "/weather {\"city\": \"Oslo\"}",
        )
        .await,
    );
    let to_researcher = answer_text(
        &send(
            &format!("{base}agents/researcher/"),
            "/weather {\"city\": \"Oslo\"}",
        )
        .await,
    );
    assert!(to_assistant.contains("weather"), "{to_assistant}");
    assert!(!to_assistant.starts_with("You said"), "{to_assistant}");
    assert!(to_researcher.starts_with("You said"), "{to_researcher}");

    // The default agent is also at `/`.
    assert_eq!(card(&base).await["name"], "assistant");
    let task = send(&base, "at the root").await;
    assert_eq!(answer_text(&task), "You said: at the root");
    // An agent the file does not declare is not found.
    let missing = reqwest::get(format!("{base}agents/nobody/.well-known/agent-card.json"))
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

/// A file with two agents, each with an HTTP tool `whoami` that sends a secret header.
fn two_agents_with_http_tools(target: &str) -> String {
    let mut file = String::new();
    for name in ["alpha", "beta"] {
        file.push_str(&format!(
            r#"
[[agents]]
name = "{name}"
description = "Agent {name}."

[[agents.tools.http]]
name = "whoami"
description = "Says which agent called."
method = "GET"
url = "{target}/whoami/{name}"
headers = {{ Authorization = "Bearer ${{KEEL_TEST_WHOAMI_TOKEN}}" }}
idempotent = true
"#
        ));
    }
    file
}

#[tokio::test]
async fn each_agent_calls_the_http_tool_its_file_declares_with_the_secret_from_the_environment() {
    const TOKEN: &str = "tok-3f9a1c";
    let app = axum::Router::new().route(
        "/whoami/{name}",
        get(
            |UrlPath(name): UrlPath<String>, headers: HeaderMap| async move {
                let authorized = headers.get("authorization").and_then(|v| v.to_str().ok())
                    == Some(&format!("Bearer {TOKEN}"));
                if authorized {
                    Ok(axum::Json(json!({"agent": name})))
                } else {
                    Err(axum::http::StatusCode::UNAUTHORIZED)
                }
            },
        ),
    );
    let target = support::serve(app).await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keel.toml");
    std::fs::write(&file, two_agents_with_http_tools(&target)).unwrap();
    let file_arg = file.to_str().unwrap();
    let env = [("KEEL_TEST_WHOAMI_TOKEN", TOKEN)];

    // `keel check` shows the header masked and never the secret.
    let check = keel(&["check", file_arg], &env);
    assert!(check.status.success(), "{}", text(&check.stderr));
    let shown = text(&check.stdout);
    assert!(
        shown.contains("header Authorization: Bearer ****"),
        "{shown}"
    );
    assert!(!shown.contains(TOKEN), "the secret leaked: {shown}");
    // Without the variable the file does not load, and the error says where and why.
    let unset = keel(&["check", file_arg], &[]);
    assert!(!unset.status.success());
    let error = text(&unset.stderr);
    assert!(
        error.contains("keel.toml:11:29: agents[0].tools.http[0].headers.Authorization"),
        "{error}"
    );
    assert!(
        error.contains("`KEEL_TEST_WHOAMI_TOKEN` is not set"),
        "{error}"
    );

    let server = KeelServer::start_with_env(&["--config", file_arg, "--store", "memory"], &env);
    for name in ["alpha", "beta"] {
        let task = send(&format!("{}agents/{name}/", server.url), "/whoami {}").await;
        assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
        let answer = answer_text(&task);
        assert!(
            answer.contains(&format!("\"agent\":\"{name}\"")),
            "{name} answered {answer}"
        );
    }
}

fn write(dir: &Path, contents: &str) -> String {
    let file = dir.join("keel.toml");
    std::fs::write(&file, contents).unwrap();
    file.to_str().unwrap().to_owned()
}

/// Issue 43, item 13: `keel check` names every environment variable to set at once: the
/// file's `${VAR}`s and the provider keys its models read (OPENAI_API_KEY, ...), whichever
/// comes first in the file.
#[test]
fn check_names_every_missing_variable_and_provider_key_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let agent = |name: &str, model: &str| {
        format!("[[agents]]\nname = \"{name}\"\ndescription = \"A.\"\n\n[agents.model]\nid = \"{model}\"\n\n")
    };
    let keys = format!(
        "{}{}",
        agent("a", "openai:gpt-4o"),
        agent("b", "anthropic:claude-x")
    );
    let secret = "[[server.api_keys]]\nkey = \"${KEEL_TEST_UNSET_KEY}\"\ntenant = \"a/b\"\n\n";
    let check = |contents: &str| {
        let file = write(dir.path(), contents);
        let out = Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(["check", "--config", &file])
            .env_remove("OPENAI_API_KEY")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("KEEL_TEST_UNSET_KEY")
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        text(&out.stderr)
    };
    // The two models' keys.
    let error = check(&keys);
    assert!(error.contains("agents[0].model.id: "), "{error}");
    assert!(error.contains("OPENAI_API_KEY"), "{error}");
    assert!(
        error.contains("; also: agents[1].model.id: ") && error.contains("ANTHROPIC_API_KEY"),
        "{error}"
    );
    // A `${VAR}` first, then both keys.
    let error = check(&format!("{secret}{keys}"));
    assert!(
        error.contains(
            "server.api_keys[0].key: the environment variable `KEEL_TEST_UNSET_KEY` is not set"
        ),
        "{error}"
    );
    assert!(
        error.contains("OPENAI_API_KEY") && error.contains("ANTHROPIC_API_KEY"),
        "{error}"
    );
}

#[test]
fn a_bad_file_is_refused_with_its_line_column_field_and_a_suggestion() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "[[agents]]\nname = \"a\"\ndescription = \"A.\"\n\n[agents.model]\nid = \"mock\"\ntemprature = 0.5\n",
    );
    for command in [
        vec!["check", &file],
        vec!["serve", "--port", "0", "--config", &file],
    ] {
        let out = keel(&command, &[]);
        assert!(!out.status.success(), "{command:?} accepted a bad file");
        let error = text(&out.stderr);
        assert!(
            error.contains("keel.toml:7:1: agents[0].model.temprature: unknown field `temprature`"),
            "{error}"
        );
        assert!(error.contains("did you mean `temperature`?"), "{error}");
    }
    let file = write(
        dir.path(),
        "[server]\nport = \"eighty\"\n\n[[agents]]\nname = \"a\"\ndescription = \"A.\"\n",
    );
    let error = text(&keel(&["check", &file], &[]).stderr);
    assert!(
        error.contains("keel.toml:2:8: server.port: invalid type"),
        "{error}"
    );
    assert!(error.contains("expected u16"), "{error}");
}

#[tokio::test]
async fn an_asynchronous_http_tool_from_the_file_answers_through_its_agents_callback_route() {
    let invocations = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let seen = invocations.clone();
    let app = axum::Router::new().route(
        "/invoke",
        axum::routing::post(move |axum::Json(invocation): axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(invocation.clone());
                // Answer later, as an asynchronous tool does: after the acknowledgement.
                tokio::spawn(async move {
                    let sent = reqwest::Client::new()
                        .post(invocation["callback_url"].as_str().unwrap_or_default())
                        .header(
                            "x-keel-callback-secret",
                            invocation["callback_secret"].as_str().unwrap_or_default(),
                        )
                        .json(&json!({"output": {"frames": 24}}))
                        .send()
                        .await;
                    assert!(sent.is_ok_and(|r| r.status().is_success()));
                });
                (
                    axum::http::StatusCode::ACCEPTED,
                    axum::Json(json!({"status": "accepted"})),
                )
            }
        }),
    );
    let target = support::serve(app).await;

    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        &format!(
            r#"
[[agents]]
name = "front"
description = "The default agent."

[[agents]]
name = "worker"
description = "Renders."

[[agents.tools.http]]
name = "render"
description = "Render; the result arrives later."
url = "{target}/invoke"
asynchronous = true
"#
        ),
    );
    let server = KeelServer::start_with(&["--config", &file, "--store", "memory"]);
    let task = send(&format!("{}agents/worker/", server.url), "/render {}").await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert!(answer_text(&task).contains("\"frames\":24"), "{task}");
    let invocations = invocations.lock().unwrap();
    let callback = invocations[0]["callback_url"].as_str().unwrap();
    assert!(
        callback.starts_with(&format!("{}agents/worker/callbacks/", server.url)),
        "{callback}"
    );
}

#[tokio::test]
async fn serve_reads_keel_toml_from_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "[server]\nstore = \"memory\"\n\n[[agents]]\nname = \"local\"\ndescription = \"From ./keel.toml.\"\n",
    );
    let server = KeelServer::start_in(dir.path(), &[]);
    assert_eq!(card(&server.url).await["name"], "local");
    assert_eq!(
        card(&format!("{}agents/local/", server.url)).await["name"],
        "local"
    );
}

/// SendMessage asking for push notifications to `webhook`; the whole JSON-RPC answer.
async fn send_with_push(endpoint: &str, webhook: &str) -> Value {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {
            "message": {"messageId": support::uuid_like(), "role": "ROLE_USER", "parts": [{"text": "hello"}]},
            "configuration": {"taskPushNotificationConfig": {"url": webhook, "token": "tok-7d1"}}
        }
    });
    reqwest::Client::new()
        .post(endpoint)
        .header("A2A-Version", "1.0")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

#[tokio::test]
async fn push_notifications_reach_only_the_targets_the_allow_list_names() {
    // One webhook server on loopback: `/allowed/...` is listed, `/elsewhere` is not.
    let received = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, Value)>::new()));
    let seen = received.clone();
    let app = axum::Router::new().route(
        "/{*path}",
        axum::routing::post(move |UrlPath(path): UrlPath<String>, body: String| {
            let seen = seen.clone();
            async move {
                let body = serde_json::from_str(&body).unwrap_or(Value::Null);
                seen.lock().unwrap().push((path, body));
                "ok"
            }
        }),
    );
    let base = support::serve(app).await;
    let listed = format!("{base}/allowed/");

    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        &format!(
            "[server]\nstore = \"memory\"\n\n[server.push]\nallow_targets = [\"{listed}\"]\n\n\
             [[agents]]\nname = \"notifier\"\ndescription = \"Answers.\"\n"
        ),
    );
    let check = keel(&["check", &file], &[]);
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(
        text(&check.stdout).contains(&format!("push notifications only to: {listed}")),
        "{}",
        text(&check.stdout)
    );
    // From the file, and for the built-in demo agent from the command line.
    let from_file = KeelServer::start_with(&["--config", &file]);
    let demo = KeelServer::start(&["--push-target", &listed]);
    for (server, which) in [(&from_file, "file"), (&demo, "demo")] {
        let refused = send_with_push(&server.url, &format!("{base}/elsewhere")).await;
        assert_eq!(refused["error"]["code"], -32602, "{which}: {refused}");
        let message = refused["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("not in the operator's push target allow list")
                && message.contains(&listed),
            "{which}: {message}"
        );
        let accepted = send_with_push(&server.url, &format!("{listed}{which}")).await;
        assert!(accepted.get("result").is_some(), "{which}: {accepted}");
        support::wait_until(
            &format!("the {which} server's completed status at the listed webhook"),
            std::time::Duration::from_secs(20),
            || async { received.lock().unwrap().clone() },
            |received| {
                received.iter().any(|(path, body)| {
                    *path == format!("allowed/{which}")
                        && body["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
                })
            },
        )
        .await;
    }
    assert!(
        received
            .lock()
            .unwrap()
            .iter()
            .all(|(path, _)| path.starts_with("allowed/")),
        "a refused target was reached"
    );

    // `--push-target` replaces the file's list, and the server says which list holds.
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "serve",
            "--port",
            "0",
            "--config",
            &file,
            "--push-target",
            "10.9.0.0/16",
        ])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let shown = std::io::BufRead::lines(stderr)
        .map_while(Result::ok)
        .find(|line| line.contains("push notifications"));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        shown.as_deref(),
        Some("  push notifications only to: 10.9.0.0/16")
    );

    // A malformed entry is refused where it is written.
    let bad = write(
        dir.path(),
        "[server.push]\nallow_targets = [\"ftp://x/\"]\n\n[[agents]]\nname = \"a\"\ndescription = \"A.\"\n",
    );
    let error = text(&keel(&["check", &bad], &[]).stderr);
    assert!(
        error.contains("server.push.allow_targets[0]") && error.contains("not http or https"),
        "{error}"
    );
    let flag = keel(
        &[
            "serve",
            "--port",
            "0",
            "--store",
            "memory",
            "--push-target",
            "a b",
        ],
        &[],
    );
    assert!(!flag.status.success());
    assert!(
        text(&flag.stderr).contains("--push-target"),
        "{}",
        text(&flag.stderr)
    );
}

#[tokio::test]
async fn an_agents_model_api_key_from_the_file_is_sent_instead_of_the_providers_variable() {
    const KEY: &str = "sk-agent-5e1b";
    // An OpenAI-compatible endpoint that answers only the agent's own key.
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(
            |headers: HeaderMap, axum::Json(request): axum::Json<Value>| async move {
                use axum::response::IntoResponse;
                let bearer = headers.get("authorization").and_then(|v| v.to_str().ok());
                if bearer != Some(&format!("Bearer {KEY}")) {
                    let reason = format!("wrong key: {bearer:?}");
                    return (axum::http::StatusCode::UNAUTHORIZED, reason).into_response();
                }
                support::openai_reply(
                    &request,
                    json!({"role": "assistant", "content": "keyed-answer-91"}),
                )
            },
        ),
    );
    let base = support::serve(app).await;

    let dir = tempfile::tempdir().unwrap();
    let agent = |key: &str| {
        format!(
            "[server]\nstore = \"memory\"\n\n[[agents]]\nname = \"keyed\"\ndescription = \"K.\"\n\n\
             [agents.model]\nid = \"openai-compatible:{base}/v1:test-model\"\napi_key = \"{key}\"\n"
        )
    };
    let file = write(dir.path(), &agent("${KEEL_TEST_AGENT_MODEL_KEY}"));
    // The provider's variable holds another key: the file's wins.
    let env = [
        ("KEEL_TEST_AGENT_MODEL_KEY", KEY),
        ("OPENAI_COMPATIBLE_API_KEY", "sk-provider-wrong"),
    ];
    let check = keel(&["check", &file], &env);
    assert!(check.status.success(), "{}", text(&check.stderr));
    let shown = text(&check.stdout);
    assert!(shown.contains("(api key ****)"), "{shown}");
    assert!(!shown.contains(KEY), "the key leaked: {shown}");

    let server = KeelServer::start_with_env(&["--config", &file], &env);
    let task = send(&server.url, "hello").await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(answer_text(&task), "keyed-answer-91");

    // A key written out in the file is refused, naming the field.
    let literal = write(dir.path(), &agent("sk-in-the-file"));
    let error = text(&keel(&["check", &literal], &env).stderr);
    assert!(
        error.contains("agents[0].model.api_key") && error.contains("${VAR}"),
        "{error}"
    );
    assert!(!error.contains("sk-in-the-file"), "{error}");
}

#[tokio::test(flavor = "multi_thread")]
async fn negotiate_model_lets_the_agents_own_model_reject_a_task_and_accept_asks_nothing() {
    // An OpenAI-compatible endpoint that rejects every routing request and answers the rest.
    let routed = Arc::new(AtomicUsize::new(0));
    let seen = routed.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |axum::Json(request): axum::Json<Value>| {
            let seen = seen.clone();
            async move {
                let routing = request["messages"][0]["content"]
                    .as_str()
                    .is_some_and(|system| system.starts_with("You route requests"));
                let content = if routing {
                    seen.fetch_add(1, Ordering::SeqCst);
                    r#"{"decision": "reject", "reason": "not a question for me"}"#
                } else {
                    "plain-answer-37"
                };
                support::openai_reply(&request, json!({"role": "assistant", "content": content}))
            }
        }),
    );
    let base = support::serve(app).await;

    let dir = tempfile::tempdir().unwrap();
    let file = |negotiate: &str| {
        write(
            dir.path(),
            &format!(
                "[server]\nstore = \"memory\"\n\n[[agents]]\nname = \"router\"\n\
                 description = \"R.\"\n{negotiate}\n[agents.model]\n\
                 id = \"openai-compatible:{base}/v1:test-model\"\n\n[[agents.skills]]\n\
                 id = \"answer\"\ndescription = \"Answers.\"\n"
            ),
        )
    };
    let env = [("OPENAI_COMPATIBLE_API_KEY", "sk-test")];

    let server = KeelServer::start_with_env(&["--config", &file("negotiate = \"model\"")], &env);
    let task = send(&server.url, "hello").await;
    assert_eq!(task["status"]["state"], "TASK_STATE_REJECTED", "{task}");
    assert_eq!(routed.load(Ordering::SeqCst), 1);
    drop(server);

    // Without the field the agent accepts every task and its model is asked only to answer.
    let server = KeelServer::start_with_env(&["--config", &file("")], &env);
    let task = send(&server.url, "hello").await;
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "{task}");
    assert_eq!(answer_text(&task), "plain-answer-37");
    assert_eq!(
        routed.load(Ordering::SeqCst),
        1,
        "no routing request was made"
    );
}

/// A raw JSON-RPC request (any body) to `endpoint`; the HTTP status and the JSON answer.
async fn rpc_raw(endpoint: &str, body: String) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(endpoint)
        .header("A2A-Version", "1.0")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The JSON-RPC envelope: version, the request's id echoed, exactly one of result and error,
/// an error with an integer code and a message. Answers the result or the error.
fn envelope(answer: &Value, id: &Value) -> Result<Value, Value> {
    assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
    assert_eq!(&answer["id"], id, "{answer}");
    match (answer.get("result"), answer.get("error")) {
        (Some(result), None) => Ok(result.clone()),
        (None, Some(error)) => {
            assert!(error["code"].is_i64(), "{answer}");
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{answer}"
            );
            Err(error.clone())
        }
        _ => panic!("not exactly one of result and error: {answer}"),
    }
}

/// Call `method` on `endpoint` with a fresh id; the envelope-checked answer.
async fn rpc_call(endpoint: &str, method: &str, params: Value) -> Result<Value, Value> {
    let id = json!(format!("req-{}", support::uuid_like()));
    let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let (status, answer) = rpc_raw(endpoint, body.to_string()).await;
    assert_eq!(status, 200, "{method}: {answer}");
    envelope(&answer, &id)
}

fn code(error: &Value) -> i64 {
    error["code"].as_i64().unwrap_or_default()
}

#[tokio::test]
async fn each_agents_endpoint_passes_the_a2a_json_rpc_checks_at_the_url_its_card_declares() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "[server]\nstore = \"memory\"\n\n[[agents]]\nname = \"alpha\"\ndescription = \"A.\"\n\n\
         [[agents]]\nname = \"beta\"\ndescription = \"B.\"\n",
    );
    let server = KeelServer::start_with(&["--config", &file]);
    for name in ["alpha", "beta"] {
        let card = card(&format!("{}agents/{name}/", server.url)).await;
        assert_eq!(card["name"], name, "{card}");
        let endpoint = card["supportedInterfaces"]
            .as_array()
            .and_then(|interfaces| {
                interfaces
                    .iter()
                    .find(|i| i["protocolBinding"] == "JSONRPC" && i["protocolVersion"] == "1.0")
            })
            .and_then(|i| i["url"].as_str())
            .unwrap_or_else(|| panic!("{name}'s card declares no JSON-RPC 1.0 interface: {card}"))
            .to_owned();
        assert_eq!(endpoint, format!("{}agents/{name}/", server.url));

        // SendMessage answers a task; GetTask finds it; ListTasks lists it.
        let message = json!({"messageId": support::uuid_like(), "role": "ROLE_USER", "parts": [{"text": "hello"}]});
        let sent = rpc_call(&endpoint, "SendMessage", json!({"message": message}))
            .await
            .unwrap_or_else(|e| panic!("{name}: SendMessage: {e}"));
        let task = &sent["task"];
        let task_id = task["id"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {sent}"));
        assert_eq!(
            task["status"]["state"], "TASK_STATE_COMPLETED",
            "{name}: {task}"
        );
        assert!(task["contextId"].is_string(), "{task}");
        let got = rpc_call(&endpoint, "GetTask", json!({"id": task_id}))
            .await
            .unwrap_or_else(|e| panic!("{name}: GetTask: {e}"));
        assert_eq!(got["id"], task_id);
        assert_eq!(got["status"]["state"], "TASK_STATE_COMPLETED");
        let listed = rpc_call(&endpoint, "ListTasks", json!({}))
            .await
            .unwrap_or_else(|e| panic!("{name}: ListTasks: {e}"));
        let tasks = listed["tasks"]
            .as_array()
            .unwrap_or_else(|| panic!("{listed}"));
        assert!(tasks.iter().any(|t| t["id"] == task_id), "{name}: {listed}");
        assert!(
            listed["pageSize"].is_i64() && listed["totalSize"].is_i64(),
            "{listed}"
        );
        assert!(listed["nextPageToken"].is_string(), "{listed}");

        // The errors, each with its code.
        let unknown = rpc_call(&endpoint, "GetTask", json!({"id": "no-such-task"})).await;
        assert_eq!(code(&unknown.unwrap_err()), -32001, "{name}: unknown task");
        let terminal = rpc_call(&endpoint, "CancelTask", json!({"id": task_id})).await;
        assert_eq!(
            code(&terminal.unwrap_err()),
            -32002,
            "{name}: cancel of a completed task"
        );
        let unknown_method = rpc_call(&endpoint, "NoSuchMethod", json!({})).await;
        assert_eq!(
            code(&unknown_method.unwrap_err()),
            -32601,
            "{name}: unknown method"
        );
        let bad_params = rpc_call(
            &endpoint,
            "SendMessage",
            json!({"message": "not a message"}),
        )
        .await;
        assert_eq!(
            code(&bad_params.unwrap_err()),
            -32602,
            "{name}: invalid params"
        );
        let bad_params = rpc_call(&endpoint, "GetTask", json!({"id": 42})).await;
        assert_eq!(
            code(&bad_params.unwrap_err()),
            -32602,
            "{name}: invalid params"
        );

        // Malformed JSON: a parse error, with a null id (the id could not be read).
        let (status, answer) = rpc_raw(&endpoint, "{\"jsonrpc\": \"2.0\", \"id\": 1,".into()).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            code(&envelope(&answer, &Value::Null).unwrap_err()),
            -32700,
            "{name}"
        );
        // A request without a method: an invalid request, its id echoed.
        let (status, answer) = rpc_raw(
            &endpoint,
            json!({"jsonrpc": "2.0", "id": 5, "params": {}}).to_string(),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(
            code(&envelope(&answer, &json!(5)).unwrap_err()),
            -32600,
            "{name}"
        );
    }
}

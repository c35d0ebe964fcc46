//! The `keel` binary: it documents itself, serves the demo agent, and stops cleanly.

mod support;

use std::process::Command;

use support::KeelServer;

#[test]
fn help_documents_the_serve_command_and_its_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("serve"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["--host", "--port", "--public-url"] {
        assert!(text.contains(flag), "serve --help lacks {flag}: {text}");
    }
}

#[test]
fn serve_rejects_a_host_that_is_not_an_address() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--host", "not an address", "--port", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not an IP address"));
}

#[tokio::test]
async fn serve_answers_send_message_and_exits_cleanly_on_sigterm() {
    let server = KeelServer::start(&[]);
    let client = reqwest::Client::new();
    let card: serde_json::Value = client
        .get(format!("{}.well-known/agent-card.json", server.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(card["name"], "keel-demo");
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hello"}]}}
    });
    let answer: serde_json::Value = support::post_rpc(&server.url, &body).await;
    assert_eq!(
        answer["result"]["task"]["status"]["state"],
        "TASK_STATE_COMPLETED"
    );
    #[cfg(unix)]
    {
        let status = server.terminate();
        assert!(status.success(), "keel serve exited with {status}");
    }
}

#[tokio::test]
async fn serve_with_api_keys_requires_a_key_and_keeps_tenants_apart() {
    let server = KeelServer::start(&[
        "--api-key",
        "alice-key=acme/alice",
        "--api-key",
        "bob-key=acme/bob",
    ]);
    let client = reqwest::Client::new();
    let card = client
        .get(format!("{}.well-known/agent-card.json", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(card.status(), 200, "the public card needs no key");
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hello"}]}}
    });
    let anonymous = client
        .post(&server.url)
        .header("A2A-Version", "1.0")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert!(anonymous.headers().contains_key("www-authenticate"));
    let answer: serde_json::Value = client
        .post(&server.url)
        .header("A2A-Version", "1.0")
        .header("X-API-Key", "alice-key")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task_id = answer["result"]["task"]["id"].as_str().unwrap().to_owned();
    let get = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "GetTask", "params": {"id": task_id}});
    let as_bob: serde_json::Value = client
        .post(&server.url)
        .header("A2A-Version", "1.0")
        .header("Authorization", "Bearer bob-key")
        .json(&get)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        as_bob["error"]["code"], -32001,
        "another tenant cannot see the task: {as_bob}"
    );
}

#[test]
fn a_malformed_api_key_flag_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "serve",
            "--port",
            "0",
            "--store",
            "memory",
            "--api-key",
            "nokeytenant",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("KEY=APP/USER"));
}

#[test]
fn an_empty_instance_id_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "serve",
            "--port",
            "0",
            "--store",
            "memory",
            "--instance-id",
            " ",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--instance-id must not be empty"));
}

#[tokio::test]
async fn serve_agent_conformance_serves_the_tck_scenario_agent() {
    let server = KeelServer::start(&["--agent", "conformance"]);
    let card = support::card(&server.url).await;
    assert_eq!(card["capabilities"]["streaming"], true, "{card}");
    assert_eq!(card["capabilities"]["pushNotifications"], true, "{card}");
    let body = serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "SendMessage",
        "params": {"message": {"messageId": "tck-reject-task-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}
    });
    let answer: serde_json::Value = support::post_rpc(&server.url, &body).await;
    assert_eq!(
        answer["result"]["task"]["status"]["state"], "TASK_STATE_REJECTED",
        "{answer}"
    );
}

#[test]
fn serve_refuses_an_unknown_agent() {
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["serve", "--agent", "nobody", "--port", "0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("nobody"), "{stderr}");
}

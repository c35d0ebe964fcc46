//! The operator API over real HTTP beside A2A: its reads (agents, threads, tasks, pending
//! approvals, runs), served to the caller's tenant only and paged on the server, the same
//! `404` for another tenant's ids on every route, named `400`s for bad input, and the OpenAPI
//! document that lists every route. Acting and live events: `operator_live.rs`.

mod support;

use std::sync::Arc;

use keel_agent::AgentExecutor;
use keel_llm::MockLlm;
use keel_runtime::{AuthContext, Runtime};
use keel_transport::{A2aServer, Security};
use reqwest::StatusCode;
use serde_json::{json, Value};
use support::operator::{Operator, WRITE};
use support::{get_as as get, SendJson, ALICE, BOB};

#[tokio::test]
async fn tasks_approvals_and_runs_are_served_to_their_tenant_only() {
    let alice = AuthContext::new("acme", "alice");
    let runtime: Arc<dyn Runtime> = support::two_tenant_runtime(MockLlm::new());
    let executor = AgentExecutor::new(support::agent(), runtime);
    let server = A2aServer::new(executor.clone()).with_security(Security::api_key_and_bearer());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/api/v1", listener.local_addr().unwrap());
    let router = server.router("http://127.0.0.1:0");
    tokio::spawn(async move { axum::serve(listener, router).await });
    let http = reqwest::Client::new();

    let task = support::completed_task(&executor, &alice, "hello").await;

    // Tasks: Alice sees hers; Bob sees none; no credentials is 401; bad input is 400.
    let (status, page) = get(&http, &format!("{base}/tasks"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["tasks"][0]["id"], task.id.to_string());
    assert_eq!(page["total_size"], 1);
    let by_thread = format!("{base}/tasks?thread_id={}&state=completed", task.thread_id);
    let (status, page) = get(&http, &by_thread, Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 1);
    let (status, page) = get(&http, &by_thread, Some(BOB)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 0);
    assert_eq!(
        get(&http, &format!("{base}/tasks"), None).await.0,
        StatusCode::UNAUTHORIZED
    );
    let (status, bad) = get(&http, &format!("{base}/tasks?state=bogus"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_state");
    let (status, bad) = get(&http, &format!("{base}/tasks?page_size=0"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_input");
    let (status, bad) = get(&http, &format!("{base}/tasks?page_size=x"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_query");

    // Approvals: none pending.
    let (status, page) = get(&http, &format!("{base}/approvals"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["approvals"].as_array().unwrap().len(), 0);

    // A run's report: Alice's; another tenant's id is 404, as is an unknown one.
    let record = executor
        .reads()
        .latest_run(&alice, &task.id)
        .await
        .unwrap()
        .expect("the finished turn recorded a run");
    let run_url = format!("{base}/runs/{}", record.run_id);
    let (status, run) = get(&http, &run_url, Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["run_id"], record.run_id.to_string());
    let (status, refused) = get(&http, &run_url, Some(BOB)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(refused["error"]["code"], "run_not_found");
    let (status, _) = get(&http, &format!("{base}/runs/no-such-run"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Cancel: another tenant's task is 404; a finished task is 409 for its owner.
    let cancel_url = format!("{base}/tasks/{}/cancel", task.id);
    let answer = |key: &'static str| {
        http.post(&cancel_url)
            .header("X-API-Key", key)
            .json(&serde_json::json!({"reason": "operator"}))
            .send()
    };
    let refused = answer(BOB).await.unwrap();
    assert_eq!(refused.status(), StatusCode::NOT_FOUND);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "task_not_found");
    let finished = answer(ALICE).await.unwrap();
    assert_eq!(finished.status(), StatusCode::CONFLICT);
    let body: Value = finished.json().await.unwrap();
    assert_eq!(body["error"]["code"], "task_not_cancelable");
}

#[tokio::test]
async fn the_openapi_document_lists_every_operator_route() {
    let op = Operator::start().await;
    let (status, doc) = op.get(None, "/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    let routes = [
        ("get", "/api/v1/agents"),
        ("get", "/api/v1/threads"),
        ("get", "/api/v1/threads/{thread_id}"),
        ("get", "/api/v1/tasks"),
        ("get", "/api/v1/tasks/{task_id}"),
        ("get", "/api/v1/tasks/{task_id}/messages"),
        ("get", "/api/v1/approvals"),
        ("get", "/api/v1/runs"),
        ("get", "/api/v1/runs/{run_id}"),
        ("post", "/api/v1/tasks/{task_id}/cancel"),
        ("post", "/api/v1/tasks/{task_id}/approvals/{request_id}"),
        ("post", "/api/v1/threads/{thread_id}/messages"),
        ("post", "/api/v1/threads/{thread_id}/compact"),
        ("get", "/api/v1/tasks/{task_id}/events"),
        ("get", "/api/v1/threads/{thread_id}/events"),
        ("get", "/api/v1/openapi.json"),
    ];
    for (method, path) in routes {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} missing"
        );
    }
    assert_eq!(doc["paths"].as_object().unwrap().len(), routes.len());
    let decision = &doc["components"]["schemas"]["DecisionBody"];
    assert_eq!(decision["required"], json!(["decision"]), "{decision}");
    op.stop().await;
}

#[tokio::test]
async fn agents_list_their_card_tools_and_budget() {
    let op = Operator::start().await;
    let (status, answer) = op.get(Some(BOB), "/agents").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let agent = &answer["agents"][0];
    assert_eq!(agent["name"], "records");
    assert_eq!(agent["description"], "keeps records");
    assert_eq!(agent["default"], true);
    let tools = agent["tools"].as_array().unwrap();
    let write = tools
        .iter()
        .find(|t| t["name"] == "write_record")
        .expect("{tools:?}");
    assert_eq!(write["input_schema"]["required"], json!(["id"]));
    assert_eq!(
        agent["budget"],
        json!({"max_steps": 12, "max_input_tokens": 500_000, "max_runtime_seconds": 600.0}),
        "{agent}"
    );
    assert_eq!(op.get(None, "/agents").await.0, StatusCode::UNAUTHORIZED);
    op.stop().await;
}

/// Every page of a list route, following `next_page_token`: the items under `key`.
async fn all_pages(op: &Operator, path: &str, key: &str, size: u32) -> Vec<Value> {
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut url = format!("{path}{sep}page_size={size}");
        if let Some(token) = &token {
            url.push_str(&format!("&page_token={}", percent(token)));
        }
        let (status, page) = op.get(Some(ALICE), &url).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let got = page[key].as_array().unwrap();
        assert!(got.len() <= size as usize, "{page}");
        items.extend(got.iter().cloned());
        match page["next_page_token"].as_str() {
            Some(next) => token = Some(next.to_owned()),
            None => return items,
        }
    }
}

fn percent(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn threads_runs_and_tasks_page_on_the_server_without_gap_or_repeat() {
    let op = Operator::start().await;
    // Five threads; the first holds three tasks.
    for thread in ["t-0", "t-1", "t-2", "t-3", "t-4"] {
        op.send(thread, "hello").await;
    }
    op.send("t-0", "again").await;
    op.send("t-0", "and again").await;

    let threads = all_pages(&op, "/threads", "threads", 2).await;
    let ids: Vec<&str> = threads
        .iter()
        .map(|t| t["thread_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["t-0", "t-1", "t-2", "t-3", "t-4"], "{threads:?}");
    assert_eq!(threads[0]["agent"], "records");

    let runs = all_pages(&op, "/runs", "runs", 2).await;
    let mut run_ids: Vec<&str> = runs.iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    assert_eq!(run_ids.len(), 7, "{runs:?}");
    run_ids.sort_unstable();
    run_ids.dedup();
    assert_eq!(run_ids.len(), 7, "a run was listed twice");
    let of_thread = all_pages(&op, "/runs?thread_id=t-0", "runs", 1).await;
    assert_eq!(of_thread.len(), 3);
    assert!(of_thread.iter().all(|r| r["thread_id"] == "t-0"));
    let task_id = of_thread[0]["task_id"].as_str().unwrap();
    let of_task = all_pages(&op, &format!("/runs?task_id={task_id}"), "runs", 5).await;
    assert_eq!(of_task.len(), 1);
    assert_eq!(
        all_pages(&op, "/runs?agent=records", "runs", 3).await.len(),
        7
    );
    assert!(all_pages(&op, "/runs?agent=other", "runs", 3)
        .await
        .is_empty());

    let tasks = all_pages(&op, "/tasks?thread_id=t-0", "tasks", 2).await;
    assert_eq!(tasks.len(), 3);

    // One thread: its state and its recent tasks, newest first.
    let (status, thread) = op.get(Some(ALICE), "/threads/t-0").await;
    assert_eq!(status, StatusCode::OK, "{thread}");
    assert_eq!(thread["queued"], 0);
    assert_eq!(thread["recent_tasks"].as_array().unwrap().len(), 3);
    assert_eq!(thread["recent_tasks"][0]["id"], tasks[2]["id"], "{thread}");

    // Bad paging is a named 400.
    for (path, code) in [
        ("/threads?page_size=0", "invalid_input"),
        ("/runs?page_size=0", "invalid_input"),
        ("/runs?page_token=nope", "invalid_input"),
        ("/threads?page_size=x", "invalid_query"),
        ("/runs?page_size=-1", "invalid_query"),
        ("/tasks/x?history_length=y", "invalid_query"),
    ] {
        let (status, bad) = op.get(Some(ALICE), path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(bad["error"]["code"], code, "{path}: {bad}");
    }
    op.stop().await;
}

#[tokio::test]
async fn every_route_answers_another_tenants_ids_as_unknown_ones() {
    let op = Operator::start().await;
    let done = op.send("alice-thread", "hello").await;
    let waiting = op.send("alice-waits", WRITE).await;
    assert_eq!(waiting["status"]["state"], "input-required", "{waiting}");
    let (_, approvals) = op.get(Some(ALICE), "/approvals").await;
    let request_id = approvals["approvals"][0]["request"]["request_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, runs) = op.get(Some(ALICE), "/runs?thread_id=alice-thread").await;
    let run_id = runs["runs"][0]["run_id"].as_str().unwrap().to_owned();
    let task = done["id"].as_str().unwrap();
    let waits = waiting["id"].as_str().unwrap();

    // (method, path, body, code): Bob is told exactly what an unknown id tells Alice.
    let routes: Vec<(&str, String, Option<Value>, &str)> = vec![
        (
            "get",
            "/threads/alice-thread".into(),
            None,
            "thread_not_found",
        ),
        ("get", format!("/tasks/{task}"), None, "task_not_found"),
        (
            "get",
            format!("/tasks/{task}/messages"),
            None,
            "task_not_found",
        ),
        ("get", format!("/runs/{run_id}"), None, "run_not_found"),
        (
            "post",
            format!("/tasks/{waits}/cancel"),
            None,
            "task_not_found",
        ),
        (
            "post",
            format!("/tasks/{waits}/approvals/{request_id}"),
            Some(json!({"decision": "approve"})),
            "task_not_found",
        ),
        (
            "post",
            "/threads/alice-thread/compact".into(),
            None,
            "thread_not_found",
        ),
        (
            "get",
            format!("/tasks/{task}/events"),
            None,
            "task_not_found",
        ),
        (
            "get",
            "/threads/alice-thread/events".into(),
            None,
            "thread_not_found",
        ),
    ];
    let unknown = |path: &str| {
        path.replace(task, "no-such-task")
            .replace(waits, "no-such-task")
            .replace(&run_id, "no-such-run")
            .replace("alice-thread", "no-such-thread")
    };
    for (method, path, body, code) in &routes {
        for (key, path) in [(BOB, path.clone()), (ALICE, unknown(path))] {
            let (status, refused) = match *method {
                "get" => op.get(Some(key), &path).await,
                _ => op.post(Some(key), &path, body.clone()).await,
            };
            assert_eq!(
                status,
                StatusCode::NOT_FOUND,
                "{key} {method} {path}: {refused}"
            );
            assert_eq!(refused["error"]["code"], *code, "{key} {method} {path}");
        }
        // Without credentials: 401 before anything is looked up.
        let status = match *method {
            "get" => op.get(None, path).await.0,
            _ => op.post(None, path, body.clone()).await.0,
        };
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
    // Lists: Bob sees none of Alice's threads, tasks, approvals or runs.
    for (path, key) in [
        ("/threads", "threads"),
        ("/tasks", "tasks"),
        ("/approvals", "approvals"),
        ("/runs", "runs"),
    ] {
        let (status, page) = op.get(Some(BOB), path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(page[key], json!([]), "{path}: {page}");
        assert_eq!(
            op.get(None, path).await.0,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    // A message to Alice's thread id as Bob starts Bob's own thread: Alice's is untouched.
    let (status, bobs) = op
        .post(
            Some(BOB),
            "/threads/alice-thread/messages",
            Some(json!({"text": "hi"})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{bobs}");
    let (_, alices) = op.get(Some(ALICE), "/threads/alice-thread").await;
    assert_eq!(
        alices["recent_tasks"].as_array().unwrap().len(),
        1,
        "{alices}"
    );
    assert_eq!(
        op.post(
            None,
            "/threads/alice-thread/messages",
            Some(json!({"text": "hi"}))
        )
        .await
        .0,
        StatusCode::UNAUTHORIZED
    );
    // Alice's task still waits: nothing Bob sent reached it.
    let (_, still) = op.get(Some(ALICE), &format!("/tasks/{waits}")).await;
    assert_eq!(still["status"]["state"], "input-required");
    op.stop().await;
}

#[tokio::test]
async fn bad_ids_and_bodies_are_named_400s() {
    let op = Operator::start().await;
    let long = "x".repeat(300);
    for path in [
        format!("/threads/{long}"),
        format!("/tasks/{long}"),
        format!("/runs/{long}"),
        "/tasks/%20/events".to_owned(),
        "/threads/a%01b/events".to_owned(),
    ] {
        let (status, bad) = op.get(Some(ALICE), &path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(bad["error"]["code"], "invalid_id", "{path}: {bad}");
    }
    let task = op.send("bodies", "hello").await;
    let task_id = task["id"].as_str().unwrap();
    let decide = format!("/tasks/{task_id}/approvals/r-1");
    let bodies: Vec<(String, Value, &str)> = vec![
        (decide.clone(), json!({"decision": "maybe"}), "invalid_body"),
        (
            decide.clone(),
            json!({"reason": "no decision"}),
            "invalid_body",
        ),
        (
            decide,
            json!({"decision": "approve", "extra": 1}),
            "invalid_body",
        ),
        (
            "/threads/bodies/messages".into(),
            json!({"text": "  "}),
            "invalid_body",
        ),
        (
            "/threads/bodies/messages".into(),
            json!({"txt": "hi"}),
            "invalid_body",
        ),
        (
            "/threads/bodies/messages".into(),
            json!({"text": "hi", "agent": "nobody"}),
            "unknown_agent",
        ),
        (
            "/threads/bodies/compact".into(),
            json!({"strategy": "shred"}),
            "invalid_body",
        ),
        (
            format!("/tasks/{task_id}/cancel"),
            json!({"reason": 5}),
            "invalid_body",
        ),
    ];
    for (path, body, code) in bodies {
        let (status, bad) = op.post(Some(ALICE), &path, Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path} {body}: {bad}");
        assert_eq!(bad["error"]["code"], code, "{path} {body}: {bad}");
    }
    // A resume point this server did not issue.
    for (path, id) in [
        (format!("/tasks/{task_id}/events"), "x"),
        ("/threads/bodies/events".to_owned(), "not a position"),
    ] {
        let response = op
            .server
            .http
            .get(op.url(&path))
            .header("X-API-Key", ALICE)
            .header("Last-Event-ID", id)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path}");
        let bad: Value = response.json().await.unwrap();
        assert_eq!(bad["error"]["code"], "invalid_position", "{path}: {bad}");
    }
    let (status, bad) = op
        .get(Some(ALICE), &format!("/tasks/{task_id}/events?after=-1"))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(bad["error"]["code"], "invalid_position", "{bad}");
    op.stop().await;
}

#[tokio::test]
async fn several_agents_are_listed_and_a_message_goes_to_the_one_it_names() {
    let runtime: Arc<dyn Runtime> = support::two_tenant_runtime(MockLlm::new());
    let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let echo = AgentExecutor::new(support::agent(), runtime.clone());
    let records = AgentExecutor::new(support::records_agent(writes), runtime);
    let agents = keel_transport::AgentsServer::new()
        .with_agent(
            "echo",
            A2aServer::new(echo).with_security(Security::api_key_and_bearer()),
        )
        .with_agent(
            "records",
            A2aServer::new(records).with_security(Security::api_key_and_bearer()),
        )
        .with_default("records");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let router = agents.router(&base);
    tokio::spawn(async move { axum::serve(listener, router).await });
    let http = reqwest::Client::new();

    let (status, listed) = get(&http, &format!("{base}/api/v1/agents"), Some(ALICE)).await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    let names: Vec<&str> = listed["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["records", "echo"], "the default first");
    assert_eq!(listed["agents"][0]["default"], true);
    assert_eq!(listed["agents"][1]["default"], false);
    // Where each is served, as its served card says, not the URL its definition carries.
    assert_eq!(
        listed["agents"][0]["url"],
        format!("{base}/agents/records/")
    );
    assert_eq!(listed["agents"][1]["url"], format!("{base}/agents/echo/"));

    let task: Value = http
        .post(format!("{base}/api/v1/threads/two/messages"))
        .header("X-API-Key", ALICE)
        .json(&json!({"text": "hi", "agent": "echo"}))
        .json_with_status(StatusCode::OK)
        .await;
    assert_eq!(task["status"]["state"], "completed", "{task}");
    let (_, threads) = get(&http, &format!("{base}/api/v1/threads"), Some(ALICE)).await;
    assert_eq!(threads["threads"][0]["agent"], "echo", "{threads}");
}

/// Issue 40: "a thread of 10,000 tasks opens in under a second". The thread's tasks (written
/// straight to the stores, with two history entries each) page on the server, and the last
/// task's conversation is its own two entries, read back from the thread's end rather than
/// from its first messages. Times are printed, not asserted.
#[tokio::test]
async fn a_thread_of_ten_thousand_tasks_lists_and_shows_its_last_task() {
    use keel_core::{Message, Task, TaskEvent, ThreadId};
    use keel_llm::LlmMessage;

    const TASKS: usize = 10_000;
    let op = Operator::start().await;
    let first = op.send("long", "hello").await;
    let runtime = op.server.executor.runtime().clone();
    let auth = AuthContext::new("acme", "alice");
    let tasks = runtime.task_manager();
    let template = tasks
        .get_task(&auth, &first["id"].as_str().unwrap().into())
        .await
        .unwrap()
        .unwrap();
    let thread = ThreadId::from("long");
    let store = runtime.thread_store();
    let lease = store
        .acquire_lease(
            &auth,
            &thread,
            "builder",
            std::time::Duration::from_secs(60),
        )
        .await
        .unwrap()
        .unwrap();
    let started = std::time::Instant::now();
    let mut last = String::new();
    let mut entries = Vec::new();
    for i in 1..TASKS {
        let mut task = template.clone();
        task.id = Task::new(thread.clone()).id;
        let input = Message::user(format!("question {i}")).in_thread(thread.clone());
        let mut user = LlmMessage::user(format!("question {i}"));
        let mut answer = LlmMessage::assistant(format!("answer {i}"), vec![]);
        for entry in [&mut user, &mut answer] {
            entry
                .metadata
                .insert("keel.task_id".into(), json!(task.id.as_str()));
        }
        user.metadata
            .insert("keel.message_id".into(), json!(input.message_id.as_str()));
        entries.extend([user, answer]);
        tasks
            .save_task_with_events(&auth, &task, &[TaskEvent::Message { message: input }])
            .await
            .unwrap();
        last = task.id.to_string();
    }
    store.append_history(&auth, &lease, &entries).await.unwrap();
    store.release_lease(&auth, &lease).await.unwrap();
    println!("{TASKS} tasks written in {:?}", started.elapsed());

    // The thread's page: its state and its 20 most recent tasks, then its tasks a page at a
    // time.
    let started = std::time::Instant::now();
    let (status, detail) = op.get(Some(ALICE), "/threads/long").await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["recent_tasks"].as_array().unwrap().len(), 20);
    println!("the thread's detail in {:?}", started.elapsed());
    let started = std::time::Instant::now();
    let (status, page) = op
        .get(Some(ALICE), "/tasks?thread_id=long&page_size=100")
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["tasks"].as_array().unwrap().len(), 100);
    assert_eq!(page["total_size"], TASKS, "{}", page["total_size"]);
    let token = page["next_page_token"].as_str().unwrap();
    let (status, next) = op
        .get(
            Some(ALICE),
            &format!(
                "/tasks?thread_id=long&page_size=100&page_token={}",
                percent(token)
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    let (one, two): (Vec<&Value>, Vec<&Value>) = (
        page["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["id"])
            .collect(),
        next["tasks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| &t["id"])
            .collect(),
    );
    assert!(
        one.iter().all(|id| !two.contains(id)),
        "pages repeat a task"
    );
    println!("two pages of the thread's tasks in {:?}", started.elapsed());

    // The last task's conversation: its own two entries.
    let started = std::time::Instant::now();
    let (status, talk) = op
        .get(Some(ALICE), &format!("/tasks/{last}/messages"))
        .await;
    assert_eq!(status, StatusCode::OK, "{talk}");
    println!("the last task's conversation in {:?}", started.elapsed());
    assert_eq!(talk["thread_id"], "long");
    let said: Vec<&str> = talk["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        said,
        [
            format!("question {}", TASKS - 1),
            format!("answer {}", TASKS - 1)
        ]
    );
    assert_eq!(talk["messages"][1]["seq"], 2 * TASKS, "{talk}");

    // The first task, which a real run answered, shows its own exchange too.
    let (status, talk) = op
        .get(
            Some(ALICE),
            &format!("/tasks/{}/messages", first["id"].as_str().unwrap()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{talk}");
    assert_eq!(talk["messages"][0]["message"]["content"], "hello", "{talk}");
    assert_eq!(talk["messages"][0]["seq"], 1, "{talk}");
    op.stop().await;
}

//! Conformance checks of [`TaskManager`]: snapshots round-trip, events keep their order,
//! listings page and filter correctly (also while tasks change), tenants are isolated, and
//! every tenant that saved a task is listed.

use std::collections::HashSet;

use keel_core::{
    AgentError, Message, RunContext, Task, TaskEvent, TaskId, TaskState, TaskStatus, ThreadId,
};
use serde_json::json;

use super::{fresh_tenant, fresh_thread, tenant_and_thread};
use crate::{load_task_with_history, AuthContext, ListTasksFilter, Page, TaskManager, TaskOrder};

/// Unknown ids read as `None`; save is an upsert; snapshots round-trip (without history).
pub async fn task_manager_round_trip(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    assert_eq!(
        tasks.get_task(&auth, &TaskId::new()).await.unwrap(),
        None,
        "unknown task must be Ok(None)"
    );
    let mut task = Task::create(Message::user("hello ünïcödé ✓"));
    task.metadata
        .insert("k".into(), json!({"nested": [1, 2.5, null, "x"]}));
    RunContext::new().attach_to_task(&mut task).unwrap();
    tasks.save_task(&auth, &task).await.unwrap();
    let mut expected = task.clone();
    expected.history.clear();
    assert_eq!(
        tasks.get_task(&auth, &task.id).await.unwrap(),
        Some(expected),
        "snapshot must round-trip"
    );

    task.complete("done").unwrap();
    tasks.save_task(&auth, &task).await.unwrap();
    let stored = tasks.get_task(&auth, &task.id).await.unwrap().unwrap();
    assert_eq!(
        stored.state(),
        TaskState::Completed,
        "save must replace the snapshot"
    );
    assert_eq!(
        stored.state_history, task.state_history,
        "state history must round-trip"
    );
    let page = tasks
        .list_tasks(&auth, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!(page.total_size, 1, "an upsert must not add a second task");
}

/// Events come back in the order appended; unknown tasks are `TaskNotFound`; the history is
/// rebuilt from message events.
pub async fn task_manager_events_in_order(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let task = Task::create(Message::user("q"));
    tasks.save_task(&auth, &task).await.unwrap();
    let mut expected = Vec::new();
    for i in 0..40 {
        let event = if i % 3 == 0 {
            TaskEvent::status_of(&task, false)
        } else {
            TaskEvent::Message {
                message: Message::agent(format!("m{i}")),
            }
        };
        tasks.add_task_event(&auth, &task.id, &event).await.unwrap();
        expected.push(event);
    }
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        expected,
        "events must keep their order"
    );
    let full = load_task_with_history(tasks, &auth, &task.id, Some(2))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        full.history.iter().map(Message::text).collect::<Vec<_>>(),
        ["m37", "m38"]
    );

    let unknown = TaskId::new();
    let err = tasks
        .add_task_event(
            &auth,
            &unknown,
            &TaskEvent::Message {
                message: Message::user("x"),
            },
        )
        .await
        .unwrap_err();
    assert_eq!(
        err,
        AgentError::TaskNotFound {
            task_id: unknown.clone()
        },
        "append to unknown task"
    );
    let err = tasks.get_task_events(&auth, &unknown).await.unwrap_err();
    assert_eq!(
        err,
        AgentError::TaskNotFound { task_id: unknown },
        "events of unknown task"
    );
}

/// `save_task_with_events` saves the snapshot and appends the events in order, to the log
/// `add_task_event` appends to: for a new task (the snapshot comes first, so its events are
/// accepted), for a status change of a known task, for a batch of many events, and with no
/// events (exactly `save_task`). Listings follow the saved state, and another tenant sees
/// none of it.
pub async fn task_manager_save_with_events(tasks: &dyn TaskManager) {
    let (auth, other) = (fresh_tenant(), fresh_tenant());
    let mut task = Task::create(Message::user("q"));
    let submitted = TaskEvent::Message {
        message: task.history[0].clone(),
    };
    tasks
        .save_task_with_events(&auth, &task, std::slice::from_ref(&submitted))
        .await
        .expect("a new task's snapshot and first event in one write");
    assert_eq!(
        tasks.get_task(&auth, &task.id).await.unwrap(),
        Some(task.clone_without_history()),
        "the snapshot of a new task is saved, without history"
    );
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        vec![submitted.clone()],
        "a new task's events land"
    );

    task.begin().unwrap();
    let working = TaskEvent::status_of(&task, false);
    let reply = TaskEvent::Message {
        message: Message::agent("a"),
    };
    tasks
        .save_task_with_events(&auth, &task, &[working.clone(), reply.clone()])
        .await
        .unwrap();
    assert_eq!(
        tasks
            .get_task(&auth, &task.id)
            .await
            .unwrap()
            .map(|t| t.state()),
        Some(TaskState::Working),
        "the snapshot is replaced"
    );
    let later = TaskEvent::Message {
        message: Message::agent("b"),
    };
    tasks.add_task_event(&auth, &task.id, &later).await.unwrap();
    let mut expected = vec![submitted, working, reply, later];
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        expected,
        "events are appended after the earlier ones, in order, to the same log"
    );

    // More events than a backend might pass in one command (Redis scripts unpack in chunks).
    let batch: Vec<TaskEvent> = (0..1_200)
        .map(|i| TaskEvent::Message {
            message: Message::agent(format!("m{i}")),
        })
        .collect();
    tasks
        .save_task_with_events(&auth, &task, &batch)
        .await
        .unwrap();
    expected.extend(batch);
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap(),
        expected,
        "a large batch lands whole and in order"
    );

    task.complete("done").unwrap();
    tasks
        .save_task_with_events(&auth, &task, &[])
        .await
        .unwrap();
    assert_eq!(
        tasks.get_task(&auth, &task.id).await.unwrap(),
        Some(task.clone_without_history()),
        "with no events it saves the snapshot"
    );
    assert_eq!(
        tasks.get_task_events(&auth, &task.id).await.unwrap().len(),
        expected.len(),
        "with no events the log is unchanged"
    );

    let by_thread = ListTasksFilter {
        thread_id: Some(task.thread_id.clone()),
        ..Default::default()
    };
    let listed = tasks.list_tasks(&auth, &by_thread).await.unwrap();
    assert_eq!(
        (listed.total_size, ids(&listed)),
        (1, vec![task.id.clone()]),
        "the task is listed once under its thread"
    );
    for (state, count) in [(TaskState::Completed, 1), (TaskState::Working, 0)] {
        let filter = ListTasksFilter {
            state: Some(state),
            ..by_thread.clone()
        };
        assert_eq!(
            tasks.list_tasks(&auth, &filter).await.unwrap().total_size,
            count,
            "the state index follows the save ({state:?})"
        );
    }
    let full = load_task_with_history(tasks, &auth, &task.id, None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        full.history
            .iter()
            .map(Message::text)
            .take(3)
            .collect::<Vec<_>>(),
        ["q", "a", "b"],
        "the history is rebuilt from the events"
    );

    assert_eq!(
        tasks.get_task(&other, &task.id).await.unwrap(),
        None,
        "another tenant sees no snapshot"
    );
    assert!(
        matches!(
            tasks.get_task_events(&other, &task.id).await,
            Err(AgentError::TaskNotFound { .. })
        ),
        "another tenant sees no log"
    );
}

/// Listing filters by thread and state, pages in creation order without gaps or duplicates,
/// and rejects bad page tokens and a zero page size.
pub async fn task_manager_pagination(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let (thread_a, thread_b) = (fresh_thread(), fresh_thread());
    let mut in_a = Vec::new();
    for i in 0..7 {
        let mut task = Task::new(thread_a.clone());
        if i % 2 == 0 {
            task.complete("x").unwrap();
        }
        tasks.save_task(&auth, &task).await.unwrap();
        in_a.push(task.id);
    }
    for _ in 0..2 {
        tasks
            .save_task(&auth, &Task::new(thread_b.clone()))
            .await
            .unwrap();
    }
    // Re-saving an early task must not move it in the order.
    let first = tasks.get_task(&auth, &in_a[0]).await.unwrap().unwrap();
    tasks.save_task(&auth, &first).await.unwrap();

    let mut filter = ListTasksFilter {
        thread_id: Some(thread_a.clone()),
        page_size: Some(3),
        ..Default::default()
    };
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = tasks.list_tasks(&auth, &filter).await.unwrap();
        assert_eq!(page.total_size, 7, "total_size counts every match");
        assert!(page.items.len() <= 3, "page_size must be honoured");
        seen.extend(page.items.into_iter().map(|t| t.id));
        pages += 1;
        match page.next_page_token {
            Some(token) => filter.page_token = Some(token),
            None => break,
        }
        assert!(pages < 10, "pagination must end");
    }
    assert_eq!(
        seen, in_a,
        "pages must list the thread's tasks in creation order, once each"
    );

    let completed = ListTasksFilter {
        thread_id: Some(thread_a),
        state: Some(TaskState::Completed),
        ..Default::default()
    };
    let page = tasks.list_tasks(&auth, &completed).await.unwrap();
    assert_eq!(page.total_size, 4, "state filter");
    assert!(page.items.iter().all(|t| t.state() == TaskState::Completed));

    let all = tasks
        .list_tasks(&auth, &ListTasksFilter::default())
        .await
        .unwrap();
    assert_eq!(all.total_size, 9, "no filter lists the tenant's tasks");

    let bad = ListTasksFilter {
        page_token: Some("not-a-token".into()),
        ..Default::default()
    };
    assert!(
        matches!(tasks.list_tasks(&auth, &bad).await, Err(AgentError::InvalidInput { ref field, .. }) if field == "page_token"),
        "a bad page token is InvalidInput naming page_token"
    );
    let zero = ListTasksFilter {
        page_size: Some(0),
        ..Default::default()
    };
    assert!(
        matches!(tasks.list_tasks(&auth, &zero).await, Err(AgentError::InvalidInput { ref field, .. }) if field == "page_size"),
        "page_size 0 is InvalidInput naming page_size"
    );
}

/// One tenant can never read, list, append to or overwrite another's tasks.
pub async fn task_manager_tenant_isolation(tasks: &dyn TaskManager) {
    let (alice, mallory) = (fresh_tenant(), fresh_tenant());
    let task = Task::create(Message::user("alice's secret"));
    tasks.save_task(&alice, &task).await.unwrap();
    assert_eq!(
        tasks.get_task(&mallory, &task.id).await.unwrap(),
        None,
        "read across tenants"
    );
    let listed = tasks
        .list_tasks(
            &mallory,
            &ListTasksFilter {
                thread_id: Some(task.thread_id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(listed.total_size, 0, "list across tenants");
    let err = tasks
        .add_task_event(
            &mallory,
            &task.id,
            &TaskEvent::Message {
                message: Message::user("x"),
            },
        )
        .await;
    assert!(
        matches!(err, Err(AgentError::TaskNotFound { .. })),
        "append across tenants"
    );
    let mut forged = task.clone();
    forged.fail("overwritten").unwrap();
    tasks.save_task(&mallory, &forged).await.unwrap();
    let still = tasks.get_task(&alice, &task.id).await.unwrap().unwrap();
    assert_eq!(
        still.state(),
        TaskState::Submitted,
        "a save by another tenant must not touch this tenant's task"
    );
}

/// The ids of a page's items, for comparing listings.
fn ids(page: &Page<Task>) -> Vec<TaskId> {
    page.items.iter().map(|t| t.id.clone()).collect()
}

/// A page token keeps its place while the list changes: the next page neither repeats nor
/// skips a task that still matches when earlier tasks leave the filter, and a well-formed
/// token past the end (every later task left the filter) yields an empty last page with no
/// next token, not an error.
pub async fn task_manager_page_token_survives_changes(tasks: &dyn TaskManager) {
    let (auth, thread) = tenant_and_thread();
    let mut all = Vec::new();
    for _ in 0..6 {
        let task = Task::new(thread.clone());
        tasks.save_task(&auth, &task).await.unwrap();
        all.push(task);
    }
    let submitted = |page_token: Option<String>| ListTasksFilter {
        thread_id: Some(thread.clone()),
        state: Some(TaskState::Submitted),
        page_size: Some(2),
        page_token,
        order: TaskOrder::Created,
    };
    let first = tasks.list_tasks(&auth, &submitted(None)).await.unwrap();
    assert_eq!(ids(&first), [all[0].id.clone(), all[1].id.clone()]);
    let token = first
        .next_page_token
        .expect("six tasks need more than one page");

    // A task before the token leaves the filter: the next page must still start at task 2.
    all[0].complete("done").unwrap();
    tasks.save_task(&auth, &all[0]).await.unwrap();
    let second = tasks
        .list_tasks(&auth, &submitted(Some(token)))
        .await
        .unwrap();
    assert_eq!(
        ids(&second),
        [all[2].id.clone(), all[3].id.clone()],
        "a page token must not skip tasks when earlier ones leave the filter"
    );
    assert_eq!(
        second.total_size, 5,
        "total_size counts the current matches"
    );
    let token = second.next_page_token.expect("two tasks still follow");

    // Every task after the token leaves the filter: the token now points past the end.
    for task in &mut all[4..] {
        task.complete("done").unwrap();
        tasks.save_task(&auth, task).await.unwrap();
    }
    let past = tasks
        .list_tasks(&auth, &submitted(Some(token)))
        .await
        .unwrap_or_else(|e| panic!("a well-formed token past the end is not an error: {e}"));
    assert!(
        past.items.is_empty(),
        "a token past the end yields an empty page"
    );
    assert_eq!(past.next_page_token, None, "and it is the last page");
    assert_eq!(past.total_size, 3, "total_size counts the current matches");
}

/// Listing by state reflects the latest save: a task whose state changed leaves the old
/// state's listing and joins the new one, with or without a thread filter, and keeps its
/// place in unfiltered listings.
pub async fn task_manager_state_filter_follows_saves(tasks: &dyn TaskManager) {
    let (auth, thread) = tenant_and_thread();
    let (mut a, b) = (Task::new(thread.clone()), Task::new(thread.clone()));
    tasks.save_task(&auth, &a).await.unwrap();
    tasks.save_task(&auth, &b).await.unwrap();
    for thread_id in [None, Some(thread.clone())] {
        let (a, b) = (a.id.clone(), b.id.clone());
        for (state, expected, rule) in [
            (TaskState::Submitted, vec![a, b], "new tasks are submitted"),
            (TaskState::Working, vec![], "no task is working yet"),
        ] {
            assert_state_listing(tasks, &auth, (state, thread_id.clone()), &expected, rule).await;
        }
    }

    a.begin().unwrap();
    tasks.save_task(&auth, &a).await.unwrap();
    a.complete("done").unwrap();
    tasks.save_task(&auth, &a).await.unwrap();
    for thread_id in [None, Some(thread.clone())] {
        for (state, expected, rule) in [
            (
                TaskState::Submitted,
                vec![b.id.clone()],
                "a re-saved task leaves its old state's listing",
            ),
            (
                TaskState::Working,
                vec![],
                "a state passed through is not listed",
            ),
            (
                TaskState::Completed,
                vec![a.id.clone()],
                "a re-saved task joins its new state's listing",
            ),
        ] {
            assert_state_listing(tasks, &auth, (state, thread_id.clone()), &expected, rule).await;
        }
    }
    let unfiltered = ListTasksFilter {
        thread_id: Some(thread),
        ..Default::default()
    };
    let page = tasks.list_tasks(&auth, &unfiltered).await.unwrap();
    assert_eq!(
        ids(&page),
        [a.id.clone(), b.id.clone()],
        "a state change does not move a task in unfiltered listings"
    );
}

/// Assert that listing `auth`'s tasks in `state` (on `thread_id`, or on every thread) finds
/// exactly `expected`, in that order, and counts them.
async fn assert_state_listing(
    tasks: &dyn TaskManager,
    auth: &AuthContext,
    (state, thread_id): (TaskState, Option<ThreadId>),
    expected: &[TaskId],
    rule: &str,
) {
    let what = if thread_id.is_some() {
        "with a thread filter"
    } else {
        "by state alone"
    };
    let filter = ListTasksFilter {
        thread_id,
        state: Some(state),
        ..Default::default()
    };
    let page = tasks.list_tasks(auth, &filter).await.unwrap();
    assert_eq!(ids(&page), expected, "{rule} ({what})");
    assert_eq!(
        page.total_size,
        expected.len(),
        "{rule} ({what}): total_size"
    );
}

/// Listed tasks are snapshots without history, as `get_task` returns them.
pub async fn task_manager_listed_tasks_carry_no_history(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let mut task = Task::create(Message::user("question"));
    task.add_message(Message::agent("answer"));
    assert_eq!(task.history.len(), 2);
    tasks.save_task(&auth, &task).await.unwrap();
    for filter in [
        ListTasksFilter::default(),
        ListTasksFilter {
            thread_id: Some(task.thread_id.clone()),
            state: Some(TaskState::Submitted),
            ..Default::default()
        },
    ] {
        let page = tasks.list_tasks(&auth, &filter).await.unwrap();
        assert_eq!(page.items.len(), 1, "{filter:?}");
        assert!(
            page.items[0].history.is_empty(),
            "listed tasks carry no history ({filter:?})"
        );
    }
}

/// `tenants` lists every tenant that saved a task, with names that round-trip exactly.
pub async fn task_manager_lists_every_tenant(tasks: &dyn TaskManager) {
    let odd = AuthContext::new(
        format!("app:{}/x", uuid::Uuid::new_v4().simple()),
        "user/1:ü",
    );
    let plain = fresh_tenant();
    for auth in [&odd, &plain] {
        tasks
            .save_task(auth, &Task::create(Message::user("hi")))
            .await
            .unwrap();
    }
    let listed = tasks.tenants().await.unwrap();
    assert!(
        listed.contains(&odd),
        "a tenant with separators in its names is listed"
    );
    assert!(listed.contains(&plain), "every tenant with tasks is listed");
    let unique: HashSet<_> = listed.iter().collect();
    assert_eq!(unique.len(), listed.len(), "each tenant is listed once");
}

/// [`TaskOrder::RecentlyUpdated`]: newest status first (ties by id, descending), paged
/// without repeats or gaps, filtered by thread, state and `since`; a task saved with a newer
/// status moves to the front; a foreign token is `InvalidInput` naming `page_token`.
pub async fn task_manager_recently_updated_order(tasks: &dyn TaskManager) {
    let auth = fresh_tenant();
    let (thread_a, thread_b) = (fresh_thread(), fresh_thread());
    let start = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05.123456Z")
        .unwrap()
        .with_timezone(&chrono::Utc);
    let at = |seconds: i64| start + chrono::Duration::seconds(seconds);
    let status = |state: TaskState, seconds: i64| TaskStatus {
        state,
        message: None,
        timestamp: at(seconds),
    };
    // Saved out of time order; `t-3a` and `t-3b` share a timestamp.
    let specs = [
        ("t-5", &thread_a, TaskState::Working, 5),
        ("t-1", &thread_a, TaskState::Completed, 1),
        ("t-3b", &thread_b, TaskState::Working, 3),
        ("t-7", &thread_b, TaskState::Completed, 7),
        ("t-3a", &thread_a, TaskState::Completed, 3),
        ("t-2", &thread_b, TaskState::Working, 2),
        ("t-6", &thread_a, TaskState::Working, 6),
    ];
    for (id, thread, state, seconds) in specs {
        let task = Task::from_parts(TaskId::from(id), (*thread).clone(), status(state, seconds));
        tasks.save_task(&auth, &task).await.unwrap();
    }
    let recent = |since: Option<i64>| TaskOrder::RecentlyUpdated {
        since: since.map(at),
    };
    let paged = |order, thread_id: Option<&ThreadId>, state| ListTasksFilter {
        thread_id: thread_id.cloned(),
        state,
        page_size: Some(2),
        page_token: None,
        order,
    };
    assert_eq!(
        every_page(tasks, &auth, paged(recent(None), None, None)).await,
        (
            ["t-7", "t-6", "t-5", "t-3b", "t-3a", "t-2", "t-1"]
                .map(String::from)
                .to_vec(),
            7
        ),
        "newest status first, ties by id descending, every task once"
    );
    assert_eq!(
        every_page(tasks, &auth, paged(recent(Some(3)), None, None)).await,
        (
            ["t-7", "t-6", "t-5", "t-3b", "t-3a"]
                .map(String::from)
                .to_vec(),
            5
        ),
        "`since` keeps the tasks updated at or after it, and total_size counts them"
    );
    assert_eq!(
        every_page(tasks, &auth, paged(recent(None), Some(&thread_a), None)).await,
        (["t-6", "t-5", "t-3a", "t-1"].map(String::from).to_vec(), 4),
        "thread filter"
    );
    assert_eq!(
        every_page(
            tasks,
            &auth,
            paged(recent(None), None, Some(TaskState::Working))
        )
        .await,
        (["t-6", "t-5", "t-3b", "t-2"].map(String::from).to_vec(), 4),
        "state filter"
    );
    assert_eq!(
        every_page(
            tasks,
            &auth,
            paged(recent(Some(2)), Some(&thread_b), Some(TaskState::Working))
        )
        .await,
        (["t-3b", "t-2"].map(String::from).to_vec(), 2),
        "thread, state and since together"
    );

    // A new status moves a task to the front, and out of the indexes of its old state.
    let mut moved = tasks
        .get_task(&auth, &TaskId::from("t-2"))
        .await
        .unwrap()
        .unwrap();
    moved = Task::from_parts(
        moved.id.clone(),
        moved.thread_id.clone(),
        status(TaskState::Completed, 9),
    );
    tasks.save_task(&auth, &moved).await.unwrap();
    let (seen, _) = every_page(tasks, &auth, paged(recent(None), None, None)).await;
    assert_eq!(seen.first().map(String::as_str), Some("t-2"), "{seen:?}");
    assert_eq!(seen.len(), 7, "a re-saved task is listed once: {seen:?}");
    assert_eq!(
        every_page(
            tasks,
            &auth,
            paged(recent(None), Some(&thread_b), Some(TaskState::Working))
        )
        .await,
        (["t-3b"].map(String::from).to_vec(), 1),
        "the task left its old state's listing"
    );
    let bad = ListTasksFilter {
        page_token: Some("not-a-token".into()),
        order: recent(None),
        ..Default::default()
    };
    assert!(
        matches!(tasks.list_tasks(&auth, &bad).await, Err(AgentError::InvalidInput { ref field, .. }) if field == "page_token"),
        "a bad page token is InvalidInput naming page_token"
    );
}

/// Every page of `filter` (pages of at most two): the ids in order, and the first page's
/// `total_size`.
async fn every_page(
    tasks: &dyn TaskManager,
    auth: &AuthContext,
    mut filter: ListTasksFilter,
) -> (Vec<String>, usize) {
    let mut seen = Vec::new();
    let mut total = None;
    for _ in 0..20 {
        let page = tasks.list_tasks(auth, &filter).await.unwrap();
        assert!(page.items.len() <= 2, "page_size must be honoured");
        total.get_or_insert(page.total_size);
        seen.extend(page.items.into_iter().map(|t| t.id.to_string()));
        match page.next_page_token {
            Some(token) => filter.page_token = Some(token),
            None => return (seen, total.unwrap_or(0)),
        }
    }
    panic!("pagination must end");
}

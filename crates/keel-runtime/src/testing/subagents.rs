//! Conformance checks of the [`ThreadStore`] subagent registry: children listed under their
//! parent oldest first, status updates, and re-parenting.

use chrono::Utc;
use keel_core::AgentError;

use super::{fresh_tenant, fresh_thread};
use crate::{ChildThread, ThreadStore};

/// Children are registered under their parent, listed oldest first, and their status updates.
pub async fn subagent_registry(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let parent = fresh_thread();
    let mut children = Vec::new();
    for i in 0..3 {
        let child = ChildThread {
            resumable: i == 0,
            created_at: Utc::now() + chrono::Duration::milliseconds(i),
            ..ChildThread::running(
                fresh_thread(),
                parent.clone(),
                format!("researcher {i}"),
                "researcher",
            )
        };
        threads.register_child(&auth, &child).await.unwrap();
        children.push(child);
    }
    assert_eq!(
        threads.children(&auth, &parent).await.unwrap(),
        children,
        "children oldest first"
    );
    assert_eq!(
        threads
            .child(&auth, &children[1].thread_id)
            .await
            .unwrap()
            .as_ref(),
        Some(&children[1])
    );
    threads
        .set_child_status(&auth, &children[1].thread_id, "completed")
        .await
        .unwrap();
    assert_eq!(
        threads
            .child(&auth, &children[1].thread_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        "completed"
    );
    let err = threads
        .set_child_status(&auth, &fresh_thread(), "x")
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::InvalidInput { .. }),
        "status of an unregistered child"
    );
    assert!(
        threads
            .children(&fresh_tenant(), &parent)
            .await
            .unwrap()
            .is_empty(),
        "tenant isolation"
    );
}

/// Re-registering a child under another parent moves it: the old parent no longer lists it.
pub async fn subagent_reparenting_leaves_the_old_parent(threads: &dyn ThreadStore) {
    let auth = fresh_tenant();
    let (old_parent, new_parent) = (fresh_thread(), fresh_thread());
    let sibling = ChildThread::running(fresh_thread(), old_parent.clone(), "stays", "researcher");
    let mut child = ChildThread {
        thread_id: fresh_thread(),
        name: "moves".into(),
        created_at: Utc::now() + chrono::Duration::milliseconds(1),
        ..sibling.clone()
    };
    threads.register_child(&auth, &sibling).await.unwrap();
    threads.register_child(&auth, &child).await.unwrap();
    assert_eq!(
        threads.children(&auth, &old_parent).await.unwrap(),
        [sibling.clone(), child.clone()]
    );

    child.parent_thread_id = new_parent.clone();
    child.status = "handed over".into();
    threads.register_child(&auth, &child).await.unwrap();
    assert_eq!(
        threads.children(&auth, &old_parent).await.unwrap(),
        [sibling],
        "a re-registered child leaves its old parent's list"
    );
    assert_eq!(
        threads.children(&auth, &new_parent).await.unwrap(),
        [child.clone()],
        "and joins its new parent's"
    );
    assert_eq!(
        threads.child(&auth, &child.thread_id).await.unwrap(),
        Some(child),
        "the entry is replaced"
    );
}

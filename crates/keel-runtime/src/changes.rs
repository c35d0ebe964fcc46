//! What a shared store committed, announced as it commits: the feed a backend offers when it
//! can tell a process at once about the writes of every process sharing it (PostgreSQL's
//! LISTEN/NOTIFY), so that the engine wakes its watchers and stops canceled runs without
//! waiting for its next poll.

use async_trait::async_trait;
use futures::stream::BoxStream;
use keel_core::{AgentResult, TaskId};

use crate::AuthContext;

/// A change committed to a shared store, by this process or another.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreChange {
    /// Events were appended to the log of `task_id` (or its snapshot was saved).
    TaskEvents {
        /// The task's tenant.
        auth: AuthContext,
        /// The task.
        task_id: TaskId,
        /// Whether the hearing store wrote it itself (its own connections): the engine has
        /// then told its waiters already, with the snapshot it saved.
        own_write: bool,
    },
    /// The memory value `key` was saved (a cancel request is one).
    Memory {
        /// The value's tenant.
        auth: AuthContext,
        /// Its key.
        key: String,
    },
    /// Changes may have gone unheard (the feed's connection was lost and is back, or its
    /// reader fell behind): read again whatever is followed.
    Missed,
}

/// A store that announces its commits ([`Runtime::change_feed`](crate::Runtime::change_feed)).
///
/// A hint to read sooner, never the record: a follower still reads the log by sequence, and
/// treats [`StoreChange::Missed`] as "anything may have changed".
#[async_trait]
pub trait ChangeFeed: Send + Sync {
    /// Every change committed from now on; answers once the feed is in place, so that no
    /// change committed after the call returns goes unannounced. The stream ends when the
    /// store is gone.
    async fn follow(&self) -> AgentResult<BoxStream<'static, StoreChange>>;
}

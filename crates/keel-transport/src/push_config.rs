//! The push notification config: Keel's stored form of A2A's `TaskPushNotificationConfig`,
//! shared by the wire mapping and by the push module that stores configs and delivers to them.

use keel_core::TaskId;
use serde::{Deserialize, Serialize};

/// A task push notification config, in Keel's stored form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PushConfig {
    /// Unique within the task.
    pub id: String,
    /// The task whose updates are pushed.
    pub task_id: TaskId,
    /// The webhook.
    pub url: String,
    /// Sent as [`NOTIFICATION_TOKEN_HEADER`](crate::NOTIFICATION_TOKEN_HEADER).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Sent as `Authorization: <scheme> <credentials>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<PushAuthentication>,
}

/// How the agent authenticates to a webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PushAuthentication {
    /// An HTTP authentication scheme (`Bearer`, `Basic`, ...).
    pub scheme: String,
    /// The credentials for that scheme.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

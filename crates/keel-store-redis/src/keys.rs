//! The key layout: every key is `<prefix>{<tenant namespace>}:<kind>[<id>]` (see the crate
//! docs for the table). Kinds live here and nowhere else.

use keel_runtime::AuthContext;

/// Kinds followed by one id. None is a prefix of another, so `kind + id` never collides
/// across kinds whatever the ids contain.
pub(crate) mod kind {
    pub(crate) const TASK: &str = "task:";
    pub(crate) const TASK_META: &str = "task-meta:";
    pub(crate) const TASK_EVENTS: &str = "task-events:";
    pub(crate) const TASKS_BY_THREAD: &str = "tasks-by-thread:";
    pub(crate) const TASKS_BY_STATE: &str = "tasks-by-state:";
    /// The id is `<state>:<thread>`: states contain no `:`, so the split is unambiguous.
    pub(crate) const TASKS_BY_THREAD_STATE: &str = "tasks-by-thread-state:";
    /// The same three, scored by status timestamp instead of creation.
    pub(crate) const TASKS_BY_UPDATE_THREAD: &str = "tasks-by-update-thread:";
    pub(crate) const TASKS_BY_UPDATE_STATE: &str = "tasks-by-update-state:";
    pub(crate) const TASKS_BY_UPDATE_THREAD_STATE: &str = "tasks-by-update-thread-state:";
    pub(crate) const MEMORY: &str = "memory:";
    pub(crate) const HISTORY: &str = "history:";
    pub(crate) const QUEUE: &str = "queue:";
    pub(crate) const QUEUE_ITEMS: &str = "queue-items:";
    pub(crate) const QUEUE_SEQ: &str = "queue-seq:";
    pub(crate) const KV: &str = "kv:";
    pub(crate) const LEASE: &str = "lease:";
    pub(crate) const LEASE_TOKEN: &str = "lease-token:";
    pub(crate) const CHILD: &str = "child:";
    pub(crate) const CHILDREN: &str = "children:";
    pub(crate) const TASK_RECORDS_BY_TASK: &str = "task-records-by-task:";
    pub(crate) const TASK_RECORDS_BY_RUN: &str = "task-records-by-run:";
    pub(crate) const TASK_RECORDS_BY_THREAD: &str = "task-records-by-thread:";
    pub(crate) const TASK_RECORDS_BY_TRACE: &str = "task-records-by-trace:";
    pub(crate) const TASK_RECORDS_BY_AGENT: &str = "task-records-by-agent:";
    pub(crate) const RUN_REPORTS_BY_TASK: &str = "run-reports-by-task:";
    pub(crate) const RUN_REPORTS_BY_THREAD: &str = "run-reports-by-thread:";
    pub(crate) const RUN_REPORTS_BY_TRACE: &str = "run-reports-by-trace:";
    pub(crate) const RUN_REPORTS_BY_AGENT: &str = "run-reports-by-agent:";

    /// Every kind, for the collision test.
    #[cfg(test)]
    pub(crate) const ALL: &[&str] = &[
        TASK,
        TASK_META,
        TASK_EVENTS,
        TASKS_BY_THREAD,
        TASKS_BY_STATE,
        TASKS_BY_THREAD_STATE,
        TASKS_BY_UPDATE_THREAD,
        TASKS_BY_UPDATE_STATE,
        TASKS_BY_UPDATE_THREAD_STATE,
        MEMORY,
        HISTORY,
        QUEUE,
        QUEUE_ITEMS,
        QUEUE_SEQ,
        KV,
        LEASE,
        LEASE_TOKEN,
        CHILD,
        CHILDREN,
        TASK_RECORDS_BY_TASK,
        TASK_RECORDS_BY_RUN,
        TASK_RECORDS_BY_THREAD,
        TASK_RECORDS_BY_TRACE,
        TASK_RECORDS_BY_AGENT,
        RUN_REPORTS_BY_TASK,
        RUN_REPORTS_BY_THREAD,
        RUN_REPORTS_BY_TRACE,
        RUN_REPORTS_BY_AGENT,
    ];
}

/// Keys without an id, one per tenant. None starts with a kind above.
pub(crate) mod fixed {
    pub(crate) const TASK_SEQ: &str = "task-seq";
    pub(crate) const TASKS: &str = "tasks";
    pub(crate) const TASKS_BY_UPDATE: &str = "tasks-by-update";
    pub(crate) const TASK_RECORDS: &str = "task-records";
    pub(crate) const TASK_RECORD_SEQ: &str = "task-record-seq";
    pub(crate) const TASK_RECORDS_BY_TIME: &str = "task-records-by-time";
    pub(crate) const RUN_REPORTS: &str = "run-reports";
    pub(crate) const RUN_REPORTS_BY_TIME: &str = "run-reports-by-time";
    pub(crate) const QUEUED_THREADS: &str = "queued-threads";

    /// Every fixed key, for the collision test.
    #[cfg(test)]
    pub(crate) const ALL: &[&str] = &[
        TASK_SEQ,
        TASKS,
        TASKS_BY_UPDATE,
        TASK_RECORDS,
        TASK_RECORD_SEQ,
        TASK_RECORDS_BY_TIME,
        RUN_REPORTS,
        RUN_REPORTS_BY_TIME,
        QUEUED_THREADS,
    ];
}

/// System-level keys, shared by every tenant: thread timers (claimed across tenants by
/// schedulers) and the list of tenants. They live under `<prefix>{keel-system}:`; a tenant
/// base is `<prefix>{<digits>:...}:` (a namespace starts with a length), so the two never meet.
pub(crate) mod system {
    pub(crate) const BASE: &str = "{keel-system}:";
    /// Sorted set of timer ids, score = when each becomes claimable (µs): `timers-due:<agent>`
    /// per owning agent, and `timers-due` for timers without an agent (stored before timers
    /// had owners), which every agent claims.
    pub(crate) const TIMERS_DUE: &str = "timers-due";
    /// Hash per timer: `owner` (the tenant namespace), `thread`, `body`, `attempts`, `claim`,
    /// `agent`.
    pub(crate) const TIMER: &str = "timer:";
    /// Sorted set per tenant and thread (`<namespace>:<thread>`), score = due time (µs).
    pub(crate) const TIMERS_OF: &str = "timers-of:";
    /// Set of tenant namespaces that saved a task.
    pub(crate) const TENANTS: &str = "tenants";
}

/// The keys of one tenant under one prefix.
pub(crate) struct TenantKeys {
    base: String,
}

impl TenantKeys {
    /// `<prefix>{<namespace>}:`. The braces make the namespace a Redis hash tag.
    pub(crate) fn new(prefix: &str, auth: &AuthContext) -> Self {
        Self {
            base: format!("{prefix}{{{}}}:", auth.namespace()),
        }
    }

    /// What every key of this tenant starts with; scripts that derive keys get it as an arg.
    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// The key of `kind` for `id`.
    pub(crate) fn of(&self, kind: &str, id: &str) -> String {
        format!("{}{kind}{id}", self.base)
    }

    /// A per-tenant key without id.
    pub(crate) fn fixed(&self, name: &str) -> String {
        format!("{}{name}", self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_kind_is_a_prefix_of_another_or_of_a_fixed_key() {
        for a in kind::ALL {
            assert!(a.ends_with(':'), "{a}");
            for b in kind::ALL {
                assert!(a == b || !b.starts_with(a), "{a} is a prefix of {b}");
            }
            for fixed in fixed::ALL {
                assert!(!fixed.starts_with(a), "{fixed} starts with {a}");
            }
        }
        for a in fixed::ALL {
            assert!(!a.contains(':'), "{a}");
        }
    }

    #[test]
    fn tenants_get_disjoint_bases() {
        let a = TenantKeys::new("keel:", &AuthContext::new("a:b", "c"));
        let b = TenantKeys::new("keel:", &AuthContext::new("a", "b:c"));
        assert_ne!(a.base(), b.base());
        assert_eq!(a.of(kind::TASK, "t1"), "keel:{3:a:b/1:c}:task:t1");
    }
}

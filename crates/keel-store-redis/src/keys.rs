//! The key layout: every key is `<prefix>{<tenant namespace>}:<kind>[<id>]` (see the crate
//! docs for the table). Kinds live here and nowhere else.

use keel_runtime::AuthContext;

/// Declares key-name constants and `ALL` (for the collision test) listing every one of them,
/// so a new key name cannot be left out of that test.
macro_rules! key_names {
    ($($(#[$doc:meta])* $name:ident = $value:literal;)*) => {
        $($(#[$doc])* pub(crate) const $name: &str = $value;)*
        /// Every key name above, for the collision test.
        #[cfg(test)]
        pub(crate) const ALL: &[&str] = &[$($name),*];
    };
}

/// Kinds followed by one id. None is a prefix of another, so `kind + id` never collides
/// across kinds whatever the ids contain.
pub(crate) mod kind {
    key_names! {
        TASK = "task:";
        TASK_META = "task-meta:";
        TASK_EVENTS = "task-events:";
        TASKS_BY_THREAD = "tasks-by-thread:";
        TASKS_BY_STATE = "tasks-by-state:";
        /// The id is `<state>:<thread>`: states contain no `:`, so the split is unambiguous.
        TASKS_BY_THREAD_STATE = "tasks-by-thread-state:";
        /// The same three, scored by status timestamp instead of creation.
        TASKS_BY_UPDATE_THREAD = "tasks-by-update-thread:";
        TASKS_BY_UPDATE_STATE = "tasks-by-update-state:";
        TASKS_BY_UPDATE_THREAD_STATE = "tasks-by-update-thread-state:";
        MEMORY = "memory:";
        HISTORY = "history:";
        QUEUE = "queue:";
        QUEUE_ITEMS = "queue-items:";
        QUEUE_SEQ = "queue-seq:";
        KV = "kv:";
        LEASE = "lease:";
        LEASE_TOKEN = "lease-token:";
        CHILD = "child:";
        CHILDREN = "children:";
        TASK_RECORDS_BY_TASK = "task-records-by-task:";
        TASK_RECORDS_BY_RUN = "task-records-by-run:";
        TASK_RECORDS_BY_THREAD = "task-records-by-thread:";
        TASK_RECORDS_BY_TRACE = "task-records-by-trace:";
        TASK_RECORDS_BY_AGENT = "task-records-by-agent:";
        RUN_REPORTS_BY_TASK = "run-reports-by-task:";
        RUN_REPORTS_BY_THREAD = "run-reports-by-thread:";
        RUN_REPORTS_BY_TRACE = "run-reports-by-trace:";
        RUN_REPORTS_BY_AGENT = "run-reports-by-agent:";
    }
}

/// Keys without an id, one per tenant. None starts with a kind above.
pub(crate) mod fixed {
    key_names! {
        TASK_SEQ = "task-seq";
        TASKS = "tasks";
        TASKS_BY_UPDATE = "tasks-by-update";
        TASK_RECORDS = "task-records";
        TASK_RECORD_SEQ = "task-record-seq";
        TASK_RECORDS_BY_TIME = "task-records-by-time";
        RUN_REPORTS = "run-reports";
        RUN_REPORTS_BY_TIME = "run-reports-by-time";
        QUEUED_THREADS = "queued-threads";
    }
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

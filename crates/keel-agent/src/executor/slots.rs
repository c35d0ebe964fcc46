//! The work slots of a process: how many threads run at once, in all and per tenant, so that
//! one tenant's flood of threads cannot take every slot and starve the others.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use keel_runtime::AuthContext;

/// The slots: a process-wide semaphore and one per tenant that holds threads now. Both are
/// tokio semaphores, which serve waiters first come, first served; with a tenant's share
/// below the whole, the threads of other tenants always find a slot freeing up for them.
pub(super) struct Slots {
    all: Arc<Semaphore>,
    per_tenant: DashMap<String, Arc<Semaphore>, foldhash::fast::RandomState>,
    tenant_max: usize,
}

/// A slot taken: released (in both semaphores) when dropped.
pub(super) struct Slot {
    _all: OwnedSemaphorePermit,
    _tenant: OwnedSemaphorePermit,
}

impl Slots {
    /// `max` slots in all, at most `tenant_max` (capped at `max`) for one tenant.
    pub(super) fn new(max: usize, tenant_max: usize) -> Self {
        let max = max.max(1);
        Self {
            all: Arc::new(Semaphore::new(max)),
            per_tenant: DashMap::default(),
            tenant_max: tenant_max.clamp(1, max),
        }
    }

    /// Wait for a slot for a thread of `auth`: first within the tenant's share, then in all
    /// (so a tenant at its share does not queue ahead of others for the common slots).
    /// `None` once the slots are closed.
    pub(super) async fn acquire(&self, auth: &AuthContext) -> Option<Slot> {
        let tenant = self
            .per_tenant
            .entry(auth.namespace())
            .or_insert_with(|| Arc::new(Semaphore::new(self.tenant_max)))
            .clone();
        let tenant = tenant.acquire_owned().await.ok()?;
        let all = self.all.clone().acquire_owned().await.ok()?;
        Some(Slot {
            _all: all,
            _tenant: tenant,
        })
    }

    /// Forget `auth`'s semaphore when it holds no slot and waits for none, so that the map
    /// does not grow with every tenant ever served. Only that tenant's entry is looked at:
    /// this runs after every piece of work.
    pub(super) fn forget_if_idle(&self, auth: &AuthContext) {
        let tenant_max = self.tenant_max;
        self.per_tenant
            .remove_if(&auth.namespace(), |_, semaphore| {
                Arc::strong_count(semaphore) == 1 && semaphore.available_permits() == tenant_max
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[tokio::test]
    async fn a_tenant_at_its_share_leaves_slots_to_the_others() {
        let slots = Slots::new(4, 3);
        let (a, b) = (AuthContext::new("a", "u"), AuthContext::new("b", "u"));
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(slots.acquire(&a).await.unwrap());
        }
        // A fourth thread of `a` waits for its share, though a slot is free...
        assert!(slots.acquire(&a).now_or_never().is_none());
        // ...which `b` takes at once.
        let b_slot = slots.acquire(&b).await.unwrap();
        drop(held.pop());
        let again = slots.acquire(&a).await.unwrap();
        drop((held, b_slot, again));
        slots.forget_if_idle(&a);
        assert_eq!(slots.per_tenant.len(), 1, "only `a` is forgotten");
        slots.forget_if_idle(&b);
        assert!(slots.per_tenant.is_empty());
    }
}

//! Tenants as short keys: every row names its tenant by the key of the tenant's namespace in
//! the `tenants` table (decision 272): a digit or two where the namespace took thirty bytes
//! or more, in every row and every index entry.

use std::collections::HashMap;
use std::sync::{PoisonError, RwLock};

use keel_core::AgentResult;
use keel_runtime::AuthContext;
use rusqlite::{params, Connection};

use crate::codec::{select_row, SqlContext};
use crate::SqliteStore;

/// The keys of the tenants this store has used, by namespace. A key never changes once its
/// row has committed, so a key found here is the one every process sharing the file uses.
#[derive(Debug, Default)]
pub(crate) struct TenantKeys(RwLock<HashMap<String, String>>);

impl SqliteStore {
    /// The key `auth`'s tenant is stored under. A tenant's first use in a process reads its
    /// key, and makes it if the file has none (one write job); a key is kept here only once
    /// its row is committed, so no row is ever written under a key that could be undone.
    pub(crate) async fn tenant(&self, auth: &AuthContext) -> AgentResult<String> {
        let namespace = auth.namespace();
        let keys = &self.inner.tenants.0;
        if let Some(key) = keys
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&namespace)
        {
            return Ok(key.clone());
        }
        let name = namespace.clone();
        let key = match self.read(move |conn| stored_key(conn, &name)).await? {
            Some(key) => key,
            None => {
                let name = namespace.clone();
                self.write(move |conn| made_key(conn, &name)).await?
            }
        };
        let key = key.to_string();
        keys.write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(namespace, key.clone());
        Ok(key)
    }
}

/// The key of the tenant named `namespace`, if the file has one.
fn stored_key(conn: &Connection, namespace: &str) -> AgentResult<Option<i64>> {
    select_row(
        conn,
        "SELECT id FROM tenants WHERE name = ?1",
        params![namespace],
        |row| row.get(0),
        "reading a tenant's key",
    )
}

/// The key of the tenant named `namespace`, made if the file has none (another process may
/// have made it since it was read).
fn made_key(conn: &Connection, namespace: &str) -> AgentResult<i64> {
    conn.prepare_cached("INSERT INTO tenants (name) VALUES (?1) ON CONFLICT (name) DO NOTHING")
        .and_then(|mut stmt| stmt.execute(params![namespace]))
        .context("adding a tenant")?;
    conn.prepare_cached("SELECT id FROM tenants WHERE name = ?1")
        .and_then(|mut stmt| stmt.query_row(params![namespace], |row| row.get(0)))
        .context("reading a tenant's key")
}

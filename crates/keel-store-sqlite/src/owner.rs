//! The one process that runs agents on a SQLite store: an exclusive lock on a file beside the
//! database, which also keeps the instance id that process names itself by in thread leases,
//! so that the process restarted on the same file takes its predecessor's threads back at once.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use keel_core::{AgentError, AgentResult};

/// The line of the owner file that names the instance.
const INSTANCE_KEY: &str = "instance_id=";
/// The line of the owner file that names the process holding it, for the error a second
/// process gets.
const PID_KEY: &str = "pid=";

/// The claim of one process on a SQLite store, held until dropped (or until the process
/// ends, however it ends: the operating system releases the lock of a killed process).
///
/// A SQLite file is served by one process at a time (several processes share a Redis store
/// instead). The owner file beside the database, `<database>.owner`, is locked exclusively
/// while the claim lives, and keeps the instance id across restarts: a process restarted on
/// the same file, under the same id, holds its predecessor's thread leases under its own
/// name and takes them back at once ([`keel_runtime::ThreadLeases::reclaim_lease`]) instead
/// of waiting for them to lapse. Readers of the store (`keel runs`, a test) need no claim.
///
/// ```
/// use keel_store_sqlite::StoreOwner;
/// # let dir = tempfile::tempdir().unwrap();
/// let database = dir.path().join("keel.db");
/// let first = StoreOwner::claim(&database, None)?;
/// let id = first.instance_id().to_owned();
/// // A second claim while the first lives is refused, naming the file.
/// let refused = StoreOwner::claim(&database, None).unwrap_err();
/// assert!(refused.to_string().contains("keel.db.owner"), "{refused}");
/// drop(first);
/// // The next claim keeps the instance id.
/// assert_eq!(StoreOwner::claim(&database, None)?.instance_id(), id);
/// # Ok::<(), keel_core::AgentError>(())
/// ```
#[derive(Debug)]
pub struct StoreOwner {
    /// Open, and locked, for as long as the claim lives.
    _file: File,
    path: PathBuf,
    instance_id: String,
}

impl StoreOwner {
    /// Claim the store at `database` for this process: lock its owner file, and take the
    /// instance id `given`, or else the one the file keeps, or else a new one (kept in the
    /// file for the next claim). Another live claim on the same file is
    /// [`AgentError::Storage`] naming the database, the owner file and the process that
    /// holds it; so is a file that cannot be opened or locked.
    pub fn claim(database: &Path, given: Option<&str>) -> AgentResult<StoreOwner> {
        let path = Self::path_of(database);
        let operation = format!("claim the SQLite store {}", database.display());
        let failed = |err: std::io::Error| AgentError::storage_source("sqlite", &operation, err);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(failed)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let held = read_owner(&mut file);
                let holder = match (held.pid, held.instance_id) {
                    (Some(pid), Some(id)) => format!("process {pid}, instance `{id}`"),
                    (Some(pid), None) => format!("process {pid}"),
                    _ => "another process".to_owned(),
                };
                return Err(AgentError::Storage {
                    backend: "sqlite",
                    operation,
                    source: keel_core::ErrorSource::message(format!(
                        "it is in use by {holder}, which holds the lock on {}; a SQLite store \
                         is served by one process at a time: stop that one first, or share a \
                         Redis store between processes",
                        path.display()
                    )),
                });
            }
            Err(TryLockError::Error(err)) => return Err(failed(err)),
        }
        let kept = read_owner(&mut file).instance_id;
        let instance_id = match given.or(kept.as_deref()) {
            Some(id) => id.to_owned(),
            None => format!("keel-{}", uuid::Uuid::new_v4().simple()),
        };
        let text = format!(
            "{INSTANCE_KEY}{instance_id}\n{PID_KEY}{}\n",
            std::process::id()
        );
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| file.write_all(text.as_bytes()))
            .and_then(|()| file.sync_all())
            .map_err(failed)?;
        Ok(StoreOwner {
            _file: file,
            path,
            instance_id,
        })
    }

    /// The owner file of the store at `database`: its path with `.owner` added
    /// (`keel.db` → `keel.db.owner`).
    pub fn path_of(database: &Path) -> PathBuf {
        let mut name = database.as_os_str().to_owned();
        name.push(".owner");
        PathBuf::from(name)
    }

    /// The instance id this process goes by: its name in thread leases.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The owner file this claim holds locked.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// What an owner file says; either line may be missing (a new file, or one a crash cut short).
struct Held {
    instance_id: Option<String>,
    pid: Option<String>,
}

fn read_owner(file: &mut File) -> Held {
    let mut text = String::new();
    // An unreadable file says nothing: the claim writes it anew.
    if file.rewind().is_err() || file.read_to_string(&mut text).is_err() {
        text.clear();
    }
    let value = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key))
            .map(str::trim)
            .filter(|value| !value.is_empty())
            .map(str::to_owned)
    };
    Held {
        instance_id: value(INSTANCE_KEY),
        pid: value(PID_KEY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_naming_the_holder_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("keel.db");
        let first = StoreOwner::claim(&database, Some("alpha")).unwrap();
        let err = StoreOwner::claim(&database, None).unwrap_err();
        let AgentError::Storage {
            backend, operation, ..
        } = &err
        else {
            panic!("{err:?}")
        };
        assert_eq!(*backend, "sqlite");
        assert_eq!(
            *operation,
            format!("claim the SQLite store {}", database.display())
        );
        let text = err.to_string();
        assert!(
            text.contains(&format!(
                "in use by process {}, instance `alpha`",
                std::process::id()
            )),
            "{text}"
        );
        assert!(text.contains(&first.path().display().to_string()), "{text}");
    }

    #[test]
    fn the_instance_id_is_kept_across_claims_and_a_given_one_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("keel.db");
        let kept = StoreOwner::claim(&database, None)
            .unwrap()
            .instance_id()
            .to_owned();
        assert!(kept.starts_with("keel-"), "{kept}");
        assert_eq!(
            StoreOwner::claim(&database, None).unwrap().instance_id(),
            kept
        );
        assert_eq!(
            StoreOwner::claim(&database, Some("given"))
                .unwrap()
                .instance_id(),
            "given"
        );
        assert_eq!(
            StoreOwner::claim(&database, None).unwrap().instance_id(),
            "given"
        );
        assert_eq!(
            StoreOwner::path_of(&database),
            dir.path().join("keel.db.owner")
        );
    }

    #[test]
    fn a_file_cut_short_gets_a_new_instance_id() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("keel.db");
        std::fs::write(StoreOwner::path_of(&database), "instance_id=\n").unwrap();
        let owner = StoreOwner::claim(&database, None).unwrap();
        assert!(owner.instance_id().starts_with("keel-"));
        let text = std::fs::read_to_string(owner.path()).unwrap();
        assert_eq!(
            text,
            format!(
                "instance_id={}\npid={}\n",
                owner.instance_id(),
                std::process::id()
            )
        );
    }
}

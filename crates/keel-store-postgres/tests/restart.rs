//! A database restart under load, on a private PostgreSQL this test starts from the installed
//! binaries (never the shared server other tests use): writers keep persisting steps while the
//! server restarts; a write refused meanwhile is `StoreUnavailable`, every acknowledged write
//! is there afterwards, the pool and the change listener come back.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use keel_core::conversation::LlmMessage;
use keel_core::{AgentError, Message, Task, TaskEvent};
use keel_runtime::{AuthContext, StepStore, TaskManager, ThreadHistory, ThreadLeases};
use keel_store_postgres::{PostgresStore, StoreChange};

/// A PostgreSQL of this test's own: a data directory in a temp dir, a free port.
struct PrivateServer {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    root: bool,
    _dir: tempfile::TempDir,
}

impl PrivateServer {
    /// `None` when no PostgreSQL is installed to start one.
    fn start() -> Option<PrivateServer> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin"))
            .find(|bin| bin.join("initdb").exists())?;
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.trim_ascii() == b"0");
        let dir = tempfile::tempdir().unwrap();
        if root {
            assert!(Command::new("chown")
                .args(["-R", "postgres:"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success());
        }
        let data = dir.path().join("data");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = PrivateServer {
            bin,
            data,
            port,
            root,
            _dir: dir,
        };
        assert!(server
            .run("initdb")
            .arg("-D")
            .arg(&server.data)
            .args(["-U", "postgres", "--auth=trust", "--no-sync"])
            .stdout(Stdio::null())
            .status()
            .unwrap()
            .success());
        server.pg_ctl("start");
        Some(server)
    }

    fn run(&self, program: &str) -> Command {
        let program = self.bin.join(program);
        if self.root {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(program);
            cmd
        } else {
            Command::new(program)
        }
    }

    /// `pg_ctl <action>` (start, restart, stop), waiting for it to finish.
    fn pg_ctl(&self, action: &str) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            socket_dir(&self.data).display()
        );
        let status = self
            .run("pg_ctl")
            .arg(action)
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "-o", &options, "-l"])
            .arg(self.data.parent().unwrap().join("log"))
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "pg_ctl {action}");
    }

    fn url(&self) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }
}

fn socket_dir(data: &Path) -> PathBuf {
    data.parent().unwrap().to_owned()
}

impl Drop for PrivateServer {
    fn drop(&mut self) {
        let _ = self
            .run("pg_ctl")
            .arg("stop")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restart_under_load_loses_no_acknowledged_step_and_the_store_comes_back() {
    let Some(server) = PrivateServer::start() else {
        panic!("no PostgreSQL is installed (/usr/lib/postgresql/*/bin) to start a private one");
    };
    let store = PostgresStore::connect_with_pool_size(&server.url(), 4)
        .await
        .unwrap();
    let mut changes = store.changes().await.unwrap();
    // The first LISTEN's announcement.
    assert_eq!(changes.recv().await, Some(StoreChange::Missed));
    let auth = AuthContext::new("acme", "ops");
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    let (writing_tx, mut writing) = tokio::sync::mpsc::unbounded_channel();
    for w in 0..4 {
        let task = Task::create(Message::user("hi"));
        store.save_task(&auth, &task).await.unwrap();
        let lease = store
            .acquire_lease(&auth, &task.thread_id, "w", Duration::from_secs(600))
            .await
            .unwrap()
            .unwrap();
        let (store, auth, stop) = (store.clone(), auth.clone(), stop.clone());
        let writing_tx = writing_tx.clone();
        writers.push(tokio::spawn(async move {
            let (mut acknowledged, mut refused) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) || acknowledged < 20 {
                let text = format!("writer {w} step {acknowledged}");
                let event = TaskEvent::Message {
                    message: Message::user(text.clone()),
                };
                match store
                    .persist_step(&auth, &lease, &[LlmMessage::user(text)], &task.id, &[event])
                    .await
                {
                    Ok(()) => {
                        acknowledged += 1;
                        if acknowledged == 1 {
                            let _ = writing_tx.send(());
                        }
                    }
                    Err(AgentError::StoreUnavailable { .. }) => {
                        refused += 1;
                        // A retry's pace while the server is away, not a wait for it.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(other) => panic!("a restart is StoreUnavailable, not {other:?}"),
                }
            }
            (task, acknowledged, refused)
        }));
    }
    for _ in 0..4 {
        writing.recv().await.unwrap();
    }
    // Under load, the server restarts (a fast shutdown: clients' connections are dropped).
    tokio::task::block_in_place(|| server.pg_ctl("restart"));
    stop.store(true, Ordering::Relaxed);
    let mut refused_in_all = 0;
    for writer in writers {
        let (task, acknowledged, refused) = writer.await.unwrap();
        refused_in_all += refused;
        // A step is there exactly as often as it was acknowledged, or once more when its
        // commit landed as the connection broke (the caller then saw it refused): never less.
        let events = store.get_task_events(&auth, &task.id).await.unwrap();
        let history = store
            .read_history(&auth, &task.thread_id, 0, 100_000)
            .await
            .unwrap();
        assert_eq!(events.len(), history.len(), "a step's rows commit together");
        assert!(
            events.len() >= acknowledged && events.len() <= acknowledged + refused,
            "{} stored, {acknowledged} acknowledged, {refused} refused",
            events.len()
        );
    }
    println!("refused during the restart: {refused_in_all}");
    // The listener is back, and says changes may have been missed.
    let back = tokio::time::timeout(Duration::from_secs(60), async {
        while changes.recv().await != Some(StoreChange::Missed) {}
    })
    .await;
    assert!(back.is_ok(), "the listener reconnected");
}

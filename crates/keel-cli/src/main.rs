//! `keel`: run Keel agents here or serve them over A2A, inspect their runs, and talk to any A2A agent.

#[cfg(test)]
mod doc_commands;
mod from_file;
mod mcp;
mod remote;
mod render;
mod replay;
mod run;
mod runs;
mod telemetry;
mod tools;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{ArgMatches, Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use keel::agent::{AgentExecutor, ExecutorConfig};
use keel::services::{ApiKeyAuthService, AuthContext};
use keel::transport::callbacks::HttpCallbacks;
use keel::transport::{A2aServer, ConnectionLimits, Limits, PushTarget, Security};
use keel::{DefaultRuntime, StoreConfig};

/// Keel: an agent runtime. `keel serve` runs the demo agent over A2A; with the default
/// offline model it works with no API key and no network.
#[derive(Debug, Parser)]
#[command(name = "keel", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log more on stderr: `-v` info, `-vv` debug (client commands log only warnings by
    /// default, `keel serve` logs info). `RUST_LOG` (e.g. `RUST_LOG=keel=debug`) overrides it.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve agents over A2A v1.0 until Ctrl-C or SIGTERM: those of `--config FILE` (or
    /// `./keel.toml` when present), else the demo agent.
    ///
    /// The default agent's card is at /.well-known/agent-card.json and its JSON-RPC endpoint
    /// at /; with a file, each agent is also at /agents/NAME/.
    ///
    /// Shutdown (SIGTERM, Ctrl-C): new connections are refused and no new work starts;
    /// running tasks go on to their next step, for at most --drain-timeout seconds, and stop
    /// there (or, past it, where they are). They are not canceled: they stay unfinished, their
    /// threads are released, and a replica on the same store or this server restarted resumes
    /// them at once. Blocked requests are answered with the task as it stands; open streams
    /// end with a status update (not final) whose message says the server is going away.
    ///
    /// Restart: unfinished tasks resume at once, each named in the log. A SQLite store is
    /// served by one `keel serve` at a time (a second one is refused, naming the file): it
    /// keeps its instance id in a file beside the database (`keel.db.owner`), so even after
    /// a crash or kill -9 the restarted server takes its threads back at once. On Redis a
    /// crashed server's threads wait for their leases to lapse (--lease-ttl; a live replica
    /// takes them over then) unless it restarts under the same --instance-id; the log says
    /// how long.
    Serve(ServeArgs),
    /// Write a commented `keel.toml` that runs offline and shows every section.
    Init(InitArgs),
    /// Validate a `keel.toml` and print what it would serve (secrets masked).
    Check(CheckArgs),
    /// Process one input and exit (the ephemeral runtime): a user message (`--thread`,
    /// `--message`) or an asynchronous tool's result (`--callback`, `--secret`, `--result`).
    ///
    /// The thread runs until it must wait (final answer, pending asynchronous tool, approval,
    /// input); everything is persisted in the store, and the task's state is printed as one
    /// JSON object on stdout.
    RunOnce(RunOnceArgs),
    /// Run an agent in this process on the configured store and show the run live: model
    /// calls, streamed tokens, tool calls and results, policy decisions, budget, the answer.
    ///
    /// An action that needs approval is asked on the terminal (or read as one line from piped
    /// stdin: `y` approves, anything else or no line denies), unless `--approve`/`--deny`.
    /// Ctrl-C cancels the run. Exit status: 0 completed, 1 failed or rejected, 3 waiting for
    /// input, 130 canceled.
    Run(RunArgs),
    /// The runs kept in the configured store: list them, show one as a timeline, export its
    /// report as JSON.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// Replay a recorded run through the agent as it is defined now: the recorded model
    /// answers and tool results stand in for the model and the tools (nothing runs, no model
    /// is called), and the first divergence from the recording is printed (step, event,
    /// field, recorded vs now). See docs/replay.md.
    ///
    /// Exit status: 0 no divergence, 1 diverged (or called a tool the recording never
    /// called), 2 the run could not be replayed.
    Replay(ReplayArgs),
    /// Replay every exported run (`*.json`, from `keel runs export RUN -o FILE`) in a folder
    /// as `keel replay` does, and print a summary: the runs kept as regression tests.
    ///
    /// Exit status: 0 every run replayed without divergence, 1 one diverged or could not be
    /// replayed, 2 the folder or the agents could not be read.
    Test(TestArgs),
    /// Send one message to an A2A agent and print its answer when the task rests.
    Send {
        /// The text.
        text: String,
        /// Continue this thread (A2A `contextId`).
        #[arg(long)]
        thread: Option<String>,
        /// Answer this task (one that waits for input).
        #[arg(long)]
        task: Option<String>,
        /// Answer with the submitted task at once instead of waiting for it to rest.
        #[arg(long)]
        return_immediately: bool,
        /// The task as A2A JSON on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// The tasks of an A2A agent: list, get, cancel, subscribe, approve.
    #[command(subcommand)]
    Tasks(TasksCommand),
    /// The threads of a Keel agent: compact one's history.
    #[command(subcommand)]
    Threads(ThreadsCommand),
    /// A conversation with an agent in this process, on one thread: each line is a message,
    /// each turn shown as `keel run` shows it. `/exit` or the end of the input ends it.
    Chat(ChatArgs),
    /// List the tools each agent's model sees (built-in, HTTP, remote agents, MCP servers),
    /// with their schemas and flags; MCP servers are started to list theirs.
    Tools {
        /// Only this agent of the file.
        #[arg(long)]
        agent: Option<String>,
        /// The `keel.toml` (default: ./keel.toml when it exists, else the demo agent).
        #[arg(long, env = "KEEL_CONFIG")]
        config: Option<PathBuf>,
        /// As JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Serve agents as an MCP server over stdio, one tool per agent (`{message, thread?}`
    /// in, the answer out): every agent of the file, or only `--agent`.
    Mcp {
        /// Only this agent of the file.
        #[arg(long)]
        agent: Option<String>,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// Print a shell completion script: `keel completions bash > /etc/bash_completion.d/keel`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Args)]
struct ReplayArgs {
    /// An exported run's file (`keel runs export RUN -o FILE`), or a run id (or task id) of
    /// the store.
    run: String,
    /// Replay through this agent of the file (default: the agent that made the recording
    /// when the file declares it, else the file's default agent).
    #[arg(long)]
    agent: Option<String>,
    /// Fork instead of comparing: serve the recorded answers before model call N (from 1),
    /// then go on live with the agent's own model (the demo agent's: `--llm`) and its real
    /// tools, as a new run of the store linked to the recorded one (`keel runs list` shows
    /// it under FORKED FROM).
    #[arg(long, value_name = "N")]
    fork_at: Option<u32>,
    /// The verdict as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    source: SourceArgs,
}

#[derive(Debug, Args)]
struct TestArgs {
    /// The folder of exported runs.
    dir: PathBuf,
    /// Replay through this agent of the file (default: each recording's agent when the file
    /// declares it, else the file's default agent).
    #[arg(long)]
    agent: Option<String>,
    /// The summary and each run's verdict as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    source: SourceArgs,
}

#[derive(Debug, Args)]
struct ChatArgs {
    /// The agent of the file to talk to (default: the file's default agent).
    #[arg(long)]
    agent: Option<String>,
    /// Continue this thread (default: a new one).
    #[arg(long)]
    thread: Option<String>,
    #[command(flatten)]
    approval: ApprovalArgs,
    #[command(flatten)]
    source: SourceArgs,
}

/// How `keel run` and `keel chat` answer an action that needs approval (default: ask).
#[derive(Debug, Args)]
struct ApprovalArgs {
    /// Approve every action that needs approval.
    #[arg(long, conflicts_with = "deny")]
    approve: bool,
    /// Deny every action that needs approval.
    #[arg(long)]
    deny: bool,
}

impl ApprovalArgs {
    fn approver(self) -> run::Approver {
        run::Approver::from_flags(self.approve, self.deny)
    }
}

/// An A2A agent to talk to.
#[derive(Debug, Args)]
struct RemoteArgs {
    /// The agent's base URL (its card is at URL/.well-known/agent-card.json).
    #[arg(long, env = "KEEL_URL")]
    url: String,
    /// Sent as the `X-API-Key` header.
    #[arg(long, env = "KEEL_API_KEY")]
    api_key: Option<String>,
}

impl RemoteArgs {
    fn remote(self) -> remote::Remote {
        remote::Remote {
            url: self.url,
            api_key: self.api_key,
        }
    }
}

#[derive(Debug, Subcommand)]
enum ThreadsCommand {
    /// Compact what the model sees of a thread's history, as automatic compaction would
    /// (the log stays whole; see docs/compaction.md). The thread must be idle.
    ///
    /// With `--url`, on that agent's server (any `keel serve`); without it, in this process on
    /// the configured store (`--config`, `--store`), as `keel run` and `keel chat` keep it.
    Compact {
        /// The thread.
        thread: String,
        /// `recent` keeps the newest messages, `tokens` the newest within --max-tokens,
        /// `summary` has the agent's model summarise the rest.
        #[arg(long, value_enum, default_value_t = Strategy::Recent)]
        strategy: Strategy,
        /// Most messages kept (`recent`).
        #[arg(long)]
        max_messages: Option<usize>,
        /// Most estimated tokens kept (`tokens`).
        #[arg(long)]
        max_tokens: Option<u64>,
        /// Newest messages kept word for word (`summary`).
        #[arg(long)]
        preserve_recent: Option<usize>,
        /// The result as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Compact on this A2A agent's server (its base URL) instead of in this process.
        #[arg(long, env = "KEEL_URL")]
        url: Option<String>,
        /// With `--url`: sent as the `X-API-Key` header.
        #[arg(long, requires = "url", env = "KEEL_API_KEY")]
        api_key: Option<String>,
        /// Without `--url`: the agent of the file whose model summarises (`summary`; default:
        /// the file's default agent).
        #[arg(long, conflicts_with = "url")]
        agent: Option<String>,
        #[command(flatten)]
        source: SourceArgs,
    },
}

/// A compaction strategy, as the command line names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Strategy {
    Recent,
    Tokens,
    Summary,
}

#[derive(Debug, Subcommand)]
enum TasksCommand {
    /// The agent's tasks, most recently updated first.
    List {
        /// Only the tasks of this thread (A2A `contextId`).
        #[arg(long)]
        thread: Option<String>,
        /// Only the tasks in this state (`completed`, `working`, `input-required`, ...).
        #[arg(long)]
        state: Option<String>,
        /// At most this many (1 to 100).
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// One JSON document on stdout (A2A names).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// One task.
    Get {
        /// The task.
        id: String,
        /// The task as A2A JSON on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Cancel a task.
    Cancel {
        /// The task.
        id: String,
        /// Why (sent as `metadata.reason`).
        #[arg(long)]
        reason: Option<String>,
        /// The task as A2A JSON on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Follow a task's updates until its final status.
    Subscribe {
        /// The task.
        id: String,
        /// The A2A stream responses as JSON lines on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
    /// Approve (or `--deny`) the action a task waits to have approved.
    Approve {
        /// The task.
        id: String,
        /// The approval request's id (the task's `metadata.keel.pendingApproval.requestId` on
        /// the wire); by default the one request the task waits for.
        #[arg(long)]
        request: Option<String>,
        /// Deny instead.
        #[arg(long)]
        deny: bool,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
        /// The task as A2A JSON on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        remote: RemoteArgs,
    },
}

#[derive(Debug, Subcommand)]
enum RunsCommand {
    /// The newest runs first.
    List {
        /// Only the runs of this thread.
        #[arg(long)]
        thread: Option<String>,
        /// Only the runs that ended in this state (`completed`, `failed`, `canceled`,
        /// `input-required`, ...).
        #[arg(long)]
        state: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// One JSON document on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// One run as a timeline: steps, model calls with tokens and durations, tool calls,
    /// decisions, budget. ID is a run id or a task id (its newest run).
    Show {
        /// The run (or task).
        id: String,
        /// The run report as one JSON document on stdout.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        source: SourceArgs,
    },
    /// The run report as JSON (see docs/run-report.md), with the user's message that started
    /// it under `input`: what `keel replay` and `keel test` read (see docs/replay.md).
    Export {
        /// The run (or task).
        id: String,
        /// Write it to this file instead of stdout.
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
        #[command(flatten)]
        source: SourceArgs,
    },
}

/// Where `keel run`, `keel chat` and `keel runs` find their agents and store.
#[derive(Debug, Args)]
struct SourceArgs {
    /// The agents, from a `keel.toml` (default: ./keel.toml when it exists, else the demo
    /// agent).
    #[arg(long, env = "KEEL_CONFIG")]
    config: Option<PathBuf>,
    /// Where tasks and runs are kept, over the file's `[server] store`: `sqlite:PATH`,
    /// `redis://HOST:PORT`, `postgres://HOST/DATABASE` or `memory`.
    #[arg(long, env = "KEEL_STORE")]
    store: Option<String>,
    /// Prefix of every Redis key, over the file's.
    #[arg(long, env = "KEEL_REDIS_PREFIX")]
    redis_prefix: Option<String>,
    /// The demo agent's model (agents from a file name their own), as for `keel serve`.
    #[arg(long, default_value = "mock", env = "KEEL_LLM")]
    llm: String,
}

impl SourceArgs {
    fn source(self) -> run::Source {
        run::Source {
            config: self.config,
            store: self.store,
            redis_prefix: self.redis_prefix,
            llm: self.llm,
        }
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    /// What to ask.
    prompt: String,
    /// The agent of the file to run (default: the file's default agent).
    #[arg(long)]
    agent: Option<String>,
    /// Continue this thread (default: a new one).
    #[arg(long)]
    thread: Option<String>,
    #[command(flatten)]
    approval: ApprovalArgs,
    /// Print the run's normalized events as JSON lines on stdout instead.
    #[arg(long)]
    json: bool,
    /// Run on this remote A2A agent instead (streaming), not in process. Approvals the
    /// remote task waits for are asked here (or answered by `--approve`/`--deny`).
    #[arg(long, conflicts_with_all = ["agent"])]
    url: Option<String>,
    /// With `--url`: sent as the `X-API-Key` header.
    #[arg(long, requires = "url", env = "KEEL_API_KEY")]
    api_key: Option<String>,
    #[command(flatten)]
    source: SourceArgs,
}

#[derive(Debug, Args)]
struct InitArgs {
    /// The directory to write `keel.toml` in (default: the current one).
    dir: Option<PathBuf>,
    /// Replace an existing `keel.toml`.
    #[arg(long)]
    force: bool,
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The file to check (default: ./keel.toml).
    file: Option<PathBuf>,
    /// The file to check, named as every other command names it (the positional FILE wins).
    #[arg(long, env = "KEEL_CONFIG")]
    config: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RunOnceArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The thread the message belongs to.
    #[arg(long, requires = "message", conflicts_with = "callback")]
    thread: Option<String>,
    /// The task the message answers, when that task waits for input.
    #[arg(long, requires = "message")]
    task: Option<String>,
    /// The user message.
    #[arg(long, requires = "thread")]
    message: Option<String>,
    /// The id of the pending asynchronous tool call whose result this is.
    #[arg(long, requires_all = ["secret", "result"], conflicts_with = "message")]
    callback: Option<String>,
    /// The call's secret (sent with the invocation).
    #[arg(long, requires = "callback")]
    secret: Option<String>,
    /// The tool's output, as JSON.
    #[arg(long, requires = "callback")]
    result: Option<String>,
    /// The output is an error.
    #[arg(long, requires = "callback")]
    error: bool,
    /// Base URL asynchronous tools call back to (`{base}/callbacks/{call_id}`, served by
    /// `keel serve`).
    #[arg(long, env = "KEEL_CALLBACK_BASE_URL")]
    callback_base_url: Option<String>,
    /// Seconds to wait at most for the thread to rest.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
}

/// The store, model and thread timings of the commands that run the engine on a store of
/// their own (`keel serve`, `keel run-once`).
#[derive(Debug, Args)]
struct EngineArgs {
    /// Where tasks and threads are kept: `sqlite:PATH`, `redis://HOST:PORT` or
    /// `postgres://HOST/DATABASE` (shared by several processes) or `memory` (forgets
    /// everything at exit).
    #[arg(long, default_value = "sqlite:./keel.db", env = "KEEL_STORE")]
    store: String,
    /// Prefix of every Redis key, to keep deployments sharing one Redis apart.
    #[arg(long, default_value = "keel:", env = "KEEL_REDIS_PREFIX")]
    redis_prefix: String,
    /// The model: `mock` (offline, the default), `openai:MODEL`, `anthropic:MODEL`,
    /// `gemini:MODEL` or `openai-compatible:URL:MODEL`. Keys come from the environment
    /// (OPENAI_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY, OPENAI_COMPATIBLE_API_KEY).
    #[arg(long, default_value = "mock", env = "KEEL_LLM")]
    llm: String,
    /// Seconds a thread lease lasts unless renewed: how long the work of a crashed process
    /// waits before another process (or this one, restarted) takes it over.
    #[arg(long, default_value_t = 30.0, env = "KEEL_LEASE_TTL")]
    lease_ttl: f64,
    /// Seconds an asynchronous tool call waits for its callback before it ends as a tool
    /// error the model sees (tools may set their own).
    #[arg(long, default_value_t = 3600.0, env = "KEEL_ASYNC_TOOL_TIMEOUT")]
    async_tool_timeout: f64,
}

impl EngineArgs {
    /// `--store` with the Redis prefix applied.
    fn store_config(&self) -> Result<StoreConfig, String> {
        let mut store = StoreConfig::parse(&self.store).map_err(|err| err.to_string())?;
        if let StoreConfig::Redis { prefix, .. } = &mut store {
            self.redis_prefix.clone_into(prefix);
        }
        Ok(store)
    }

    /// `--llm` as a model.
    fn llm(&self) -> Result<Arc<dyn keel::llm::Llm>, String> {
        keel::llm::llm_from_spec(&self.llm).map_err(|err| err.to_string())
    }

    /// `--lease-ttl` as a duration, when in range.
    fn lease_ttl(&self) -> Result<Duration, String> {
        let seconds = self.lease_ttl;
        keel::config::LEASE_TTL_SECONDS
            .check(seconds)
            .map_err(|range| format!("--lease-ttl {seconds} is out of range: {range}"))
    }

    /// `--async-tool-timeout`, checked.
    fn async_tool_timeout(&self) -> Result<Duration, String> {
        let seconds = self.async_tool_timeout;
        keel::config::ASYNC_TOOL_TIMEOUT_SECONDS
            .check(seconds)
            .map_err(|range| format!("--async-tool-timeout {seconds} is out of range: {range}"))
    }
}

/// The agents `keel serve` has built in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BuiltinAgent {
    Demo,
    Conformance,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The agents to serve, from a `keel.toml` (default: ./keel.toml when it exists, else the
    /// demo agent). Flags given on the command line override the file's `[server]`.
    #[arg(long, env = "KEEL_CONFIG")]
    config: Option<PathBuf>,
    /// The built-in agent to serve without a `keel.toml`: `demo`, or `conformance` (the A2A
    /// TCK's scenarios, chosen by `messageId` prefix; see docs/conformance.md).
    #[arg(long, value_enum, default_value_t = BuiltinAgent::Demo)]
    agent: BuiltinAgent,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", env = "KEEL_HOST")]
    host: String,
    /// Port to listen on (0 picks a free one; the URL printed says which).
    #[arg(long, default_value_t = 8080, env = "KEEL_PORT")]
    port: u16,
    /// URL that clients should use, when it differs from the listening address (behind a
    /// proxy). Written into the agent card.
    #[arg(long, env = "KEEL_PUBLIC_URL")]
    public_url: Option<String>,
    #[command(flatten)]
    engine: EngineArgs,
    /// Require an API key (header `X-API-Key`, or `Authorization: Bearer KEY`) and map it to
    /// a tenant: `KEY=APP/USER`. Repeat for several keys; each tenant sees only its own tasks.
    /// Without any, every caller is the one default tenant.
    #[arg(
        long = "api-key",
        value_name = "KEY=APP/USER",
        env = "KEEL_API_KEYS",
        value_delimiter = ','
    )]
    api_keys: Vec<String>,
    /// Let push notifications go to loopback, private and link-local addresses (refused by
    /// default, to keep webhooks from reaching internal services).
    #[arg(long)]
    allow_private_push_targets: bool,
    /// Allow push notifications only to this target: a URL prefix
    /// (`https://hooks.example.com/a2a/`), a host name (`hooks.example.com`,
    /// `*.example.com`) or an IP address or CIDR block (`10.1.0.0/16`). Repeat for several;
    /// a listed target is allowed even when private, anything else is refused. Replaces the
    /// file's `server.push.allow_targets`.
    #[arg(
        long = "push-target",
        value_name = "TARGET",
        env = "KEEL_PUSH_TARGETS",
        value_delimiter = ','
    )]
    push_targets: Vec<String>,
    /// Seconds a shutdown (SIGTERM, Ctrl-C) lets running tasks go on to their next step
    /// before it stops them where they are; either way they are handed on, not canceled.
    /// Overrides the file's `server.drain_timeout_seconds`.
    #[arg(long, default_value_t = keel::agent::DEFAULT_DRAIN_TIMEOUT.as_secs_f64(), env = "KEEL_DRAIN_TIMEOUT")]
    drain_timeout: f64,
    /// This process's name in thread leases, kept across restarts: restarted under the same
    /// name, it resumes its own interrupted threads at once instead of waiting for their
    /// leases to lapse. Must differ between processes sharing a store. By default: on SQLite
    /// the id kept beside the database (`keel.db.owner`, made on first use), elsewhere random.
    #[arg(long, env = "KEEL_INSTANCE_ID")]
    instance_id: Option<String>,
    /// Most requests in one JSON-RPC batch; a larger batch is refused whole.
    #[arg(long, default_value_t = Limits::default().max_batch_requests, env = "KEEL_MAX_BATCH_REQUESTS")]
    max_batch_requests: usize,
    /// Most parts in one message.
    #[arg(long, default_value_t = Limits::default().max_message_parts, env = "KEEL_MAX_MESSAGE_PARTS")]
    max_message_parts: usize,
    /// Most requests of one tenant handled at once; more are answered HTTP 429 (JSON-RPC
    /// -32051) with `Retry-After`.
    #[arg(long, default_value_t = Limits::default().max_requests_per_tenant, env = "KEEL_MAX_REQUESTS_PER_TENANT")]
    max_requests_per_tenant: usize,
    /// Most threads this process runs at once.
    #[arg(long, default_value_t = ExecutorConfig::default().max_concurrent_threads, env = "KEEL_MAX_THREADS")]
    max_threads: usize,
    /// Most of those one tenant may hold, so that other tenants are still served.
    #[arg(long, default_value_t = ExecutorConfig::default().max_threads_per_tenant, env = "KEEL_MAX_THREADS_PER_TENANT")]
    max_threads_per_tenant: usize,
    /// Most items waiting in one thread's queue, besides the running task, when a message
    /// starts a new task there; more are answered HTTP 429 (JSON-RPC -32051) with
    /// `Retry-After`. Counted in the store.
    #[arg(long, default_value_t = ExecutorConfig::default().max_queued_per_thread, env = "KEEL_MAX_QUEUED_PER_THREAD")]
    max_queued_per_thread: usize,
    /// Most items waiting in all of one tenant's thread queues when a message starts a new
    /// task; as for --max-queued-per-thread.
    #[arg(long, default_value_t = ExecutorConfig::default().max_queued_per_tenant, env = "KEEL_MAX_QUEUED_PER_TENANT")]
    max_queued_per_tenant: usize,
    /// Seconds a connection may take to send a request's headers (from its opening, or its
    /// first byte after an idle spell); then it is closed. Over the file's `[server]`.
    #[arg(long, default_value_t = ConnectionLimits::DEFAULT_HEADER_TIMEOUT.as_secs_f64(), env = "KEEL_HEADER_TIMEOUT")]
    header_timeout: f64,
    /// Seconds a request's body may take to arrive once its headers did; a body still
    /// arriving then is answered HTTP 408 and its connection closed.
    #[arg(long, default_value_t = ConnectionLimits::DEFAULT_BODY_TIMEOUT.as_secs_f64(), env = "KEEL_BODY_TIMEOUT")]
    body_timeout: f64,
    /// Seconds a keep-alive connection stays open with no request in progress.
    #[arg(long, default_value_t = ConnectionLimits::DEFAULT_IDLE_TIMEOUT.as_secs_f64(), env = "KEEL_IDLE_TIMEOUT")]
    idle_timeout: f64,
    /// Most connections open at once; further ones wait to be accepted until one closes,
    /// while open ones are served.
    #[arg(long, default_value_t = ConnectionLimits::DEFAULT_MAX_CONNECTIONS, env = "KEEL_MAX_CONNECTIONS")]
    max_connections: usize,
    /// Serve Prometheus metrics at `/metrics` (off by default, or the file's `[server]
    /// metrics`; with KEEL_METRICS_TOKEN set, the route requires it as a bearer token). See
    /// docs/observability.md.
    #[arg(long, env = "KEEL_METRICS")]
    metrics: bool,
    /// Label the run metrics with the tenant (`app/user`): one series per tenant (or the
    /// file's `[server] metrics_tenant_labels`).
    #[arg(long, env = "KEEL_METRICS_TENANT_LABELS")]
    metrics_tenant_labels: bool,
    /// Serve the web console at `/console` (docs/console.md). It is on by default when
    /// listening on a loopback address; this turns it on elsewhere, over the file's `[server]
    /// console`.
    #[arg(long, overrides_with = "no_console")]
    console: bool,
    /// Do not serve the web console, even on a loopback address (over the file's `[server]
    /// console`).
    #[arg(long, overrides_with = "console")]
    no_console: bool,
    /// How log lines are written to stderr: `text`, or `json` (one object per line); over
    /// the file's `[server] log_format`.
    #[arg(long, value_enum, default_value_t = telemetry::LogFormat::Text, env = "KEEL_LOG_FORMAT")]
    log_format: telemetry::LogFormat,
}

impl ServeArgs {
    /// Whether `--console` or `--no-console` was given, and which.
    fn console(&self) -> Option<bool> {
        match (self.console, self.no_console) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }

    /// The connection deadlines and cap the flags set, checked; with `given`, only those
    /// given on the command line (or by their variables) over `file`'s.
    fn connection_limits(
        &self,
        file: ConnectionLimits,
        given: impl Fn(&str) -> bool,
    ) -> Result<ConnectionLimits, String> {
        let seconds = |id: &str, flag: &str, value: f64, from_file: Duration| {
            if !given(id) {
                return Ok(from_file);
            }
            keel::config::CONNECTION_TIMEOUT_SECONDS
                .check(value)
                .map_err(|range| format!("--{flag} {value} is out of range: {range}"))
        };
        if given("max_connections") && self.max_connections == 0 {
            return Err("--max-connections must be at least 1".into());
        }
        Ok(ConnectionLimits {
            header_timeout: seconds(
                "header_timeout",
                "header-timeout",
                self.header_timeout,
                file.header_timeout,
            )?,
            body_timeout: seconds(
                "body_timeout",
                "body-timeout",
                self.body_timeout,
                file.body_timeout,
            )?,
            idle_timeout: seconds(
                "idle_timeout",
                "idle-timeout",
                self.idle_timeout,
                file.idle_timeout,
            )?,
            max_connections: if given("max_connections") {
                self.max_connections
            } else {
                file.max_connections
            },
        })
    }
}

/// The engine allocates for every event and message it persists; mimalloc serves those
/// small, short-lived allocations in a fraction of glibc's instructions (decision 68).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    let cli = match Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(err) => err.exit(),
    };
    // `keel serve` reads its file once, before logging starts: the file says how to log.
    let serve_file = match &cli.command {
        Command::Serve(args) => serve_config(args.config.clone()),
        _ => None,
    };
    // Held to the end of `main`: dropping it writes the server's last buffered lines.
    let _logs = telemetry::init_logs(
        match &cli.command {
            Command::Serve(args) => telemetry::serve_log_format(
                args.log_format,
                matches
                    .subcommand_matches("serve")
                    .is_some_and(|m| given(m, "log_format")),
                serve_file.as_ref().and_then(|loaded| loaded.as_ref().ok()),
            ),
            _ => telemetry::LogFormat::Text,
        },
        match (&cli.command, cli.verbose) {
            (_, 2..) => "debug,rmcp=warn",
            (Command::Serve(_), _) | (_, 1) => "info,rmcp=warn",
            _ => "warn",
        },
        matches!(cli.command, Command::Serve(_)),
    );
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("keel: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<ExitCode, String> = match cli.command {
        Command::Serve(args) => {
            let explicit = matches.subcommand_matches("serve").cloned();
            runtime
                .block_on(serve(args, explicit, serve_file))
                .map(|()| ExitCode::SUCCESS)
        }
        Command::Init(args) => from_file::init(args.dir, args.force).map(|()| ExitCode::SUCCESS),
        Command::Check(args) => runtime
            .block_on(from_file::check(&from_file::config_path(
                args.file.or(args.config),
            )))
            .map(|()| ExitCode::SUCCESS),
        Command::Tools {
            agent,
            config,
            json,
        } => runtime
            .block_on(tools::list(config, agent, json))
            .map(|()| ExitCode::SUCCESS),
        Command::Mcp { agent, source } => runtime.block_on(mcp::serve(source.source(), agent)),
        Command::RunOnce(args) => runtime.block_on(run_once(args)).map(|()| ExitCode::SUCCESS),
        Command::Run(RunArgs {
            url: Some(url),
            api_key,
            prompt,
            thread,
            json,
            approval,
            ..
        }) => runtime.block_on(remote::run(
            remote::Remote { url, api_key },
            prompt,
            thread,
            approval.approver(),
            json,
        )),
        Command::Run(args) => runtime.block_on(run::run(
            args.source.source(),
            args.agent,
            args.thread,
            args.prompt,
            args.approval.approver(),
            args.json,
        )),
        Command::Runs(command) => runtime
            .block_on(async {
                match command {
                    RunsCommand::List {
                        thread,
                        state,
                        limit,
                        json,
                        source,
                    } => runs::list(source.source(), thread, state, limit, json).await,
                    RunsCommand::Show { id, json, source } => {
                        runs::show(source.source(), id, json).await
                    }
                    RunsCommand::Export { id, output, source } => {
                        runs::export(source.source(), id, output).await
                    }
                }
            })
            .map(|()| ExitCode::SUCCESS),
        Command::Replay(args) => Ok(match args.fork_at {
            Some(step) => runtime.block_on(replay::fork(
                args.source.source(),
                args.run,
                args.agent,
                step,
                args.json,
            )),
            None => runtime.block_on(replay::replay_one(
                args.source.source(),
                args.run,
                args.agent,
                args.json,
            )),
        }),
        Command::Test(args) => Ok(runtime.block_on(replay::test_dir(
            args.source.source(),
            args.dir,
            args.agent,
            args.json,
        ))),
        Command::Send {
            text,
            thread,
            task,
            return_immediately,
            json,
            remote,
        } => runtime.block_on(remote::send(
            remote.remote(),
            text,
            thread,
            task,
            return_immediately,
            json,
        )),
        Command::Chat(args) => runtime.block_on(run::chat(
            args.source.source(),
            args.agent,
            args.thread,
            args.approval.approver(),
        )),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "keel", &mut script);
            render::out(String::from_utf8_lossy(&script).trim_end());
            Ok(ExitCode::SUCCESS)
        }
        Command::Threads(ThreadsCommand::Compact {
            thread,
            strategy,
            max_messages,
            max_tokens,
            preserve_recent,
            json,
            url,
            api_key,
            agent,
            source,
        }) => {
            let default = keel::llm::HistoryCompactionRequest::default();
            let request = keel::llm::HistoryCompactionRequest {
                strategy: match strategy {
                    Strategy::Recent => keel::llm::CompactionStrategy::Recent,
                    Strategy::Tokens => keel::llm::CompactionStrategy::Tokens,
                    Strategy::Summary => keel::llm::CompactionStrategy::Summary,
                },
                max_messages: max_messages.unwrap_or(default.max_messages),
                max_tokens: max_tokens.unwrap_or(default.max_tokens),
                preserve_recent: preserve_recent.unwrap_or(default.preserve_recent),
                thread_id: Some(thread.into()),
                ..default
            };
            match url {
                Some(url) => runtime.block_on(remote::compact(
                    remote::Remote { url, api_key },
                    request,
                    json,
                )),
                None => runtime.block_on(run::compact(source.source(), agent, request, json)),
            }
        }
        Command::Tasks(command) => runtime.block_on(async {
            match command {
                TasksCommand::List {
                    thread,
                    state,
                    limit,
                    json,
                    remote,
                } => remote::list(remote.remote(), thread, state, limit, json).await,
                TasksCommand::Get { id, json, remote } => {
                    remote::get(remote.remote(), id, json).await
                }
                TasksCommand::Cancel {
                    id,
                    reason,
                    json,
                    remote,
                } => remote::cancel(remote.remote(), id, reason, json).await,
                TasksCommand::Subscribe { id, json, remote } => {
                    remote::subscribe(remote.remote(), id, json).await
                }
                TasksCommand::Approve {
                    id,
                    request,
                    deny,
                    reason,
                    json,
                    remote,
                } => remote::approve(remote.remote(), id, request, deny, reason, json).await,
            }
        }),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("keel: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The runtime on `store`, with `llm` as its model when given and `keys` as its API keys when
/// there are any, or why the store would not open.
pub(crate) async fn open_runtime(
    store: &StoreConfig,
    llm: Option<Arc<dyn keel::llm::Llm>>,
    keys: Vec<(String, AuthContext)>,
) -> Result<DefaultRuntime, String> {
    let mut builder = DefaultRuntime::builder().store(store.clone());
    if let Some(llm) = llm {
        builder = builder.llm_shared(llm);
    }
    if !keys.is_empty() {
        let mut auth = ApiKeyAuthService::new(run::local_tenant());
        for (key, tenant) in keys {
            auth = auth.with_key(key, tenant);
        }
        builder = builder.auth(auth);
    }
    builder
        .build()
        .await
        .map_err(|err| format!("cannot open the store {store:?}: {err}"))
}

async fn run_once(args: RunOnceArgs) -> Result<(), String> {
    use keel::ephemeral::{process_once_with, Input};
    let lease_ttl = args.engine.lease_ttl()?;
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout <= 86_400.0) {
        return Err(format!(
            "--timeout {} is out of range: use more than 0 and at most 86400 seconds",
            args.timeout
        ));
    }
    let input = match (args.message, args.callback) {
        (Some(text), None) => {
            let thread = args.thread.unwrap_or_default();
            if thread.trim().is_empty() {
                return Err("--thread must not be empty".into());
            }
            Input::Message {
                thread_id: thread.into(),
                task_id: args.task.map(Into::into),
                text,
            }
        }
        (None, Some(call_id)) => {
            let raw = args.result.unwrap_or_default();
            let output = serde_json::from_str::<serde_json::Value>(&raw)
                .map_err(|err| format!("--result must be JSON (e.g. '\"done\"'): {err}"))?;
            Input::ToolResult {
                call_id,
                secret: args.secret.unwrap_or_default(),
                output,
                is_error: args.error,
            }
        }
        _ => {
            return Err(
                "give either --thread and --message, or --callback, --secret and --result".into(),
            )
        }
    };
    let store = args.engine.store_config()?;
    let agent = keel::demo::agent().map_err(|err| err.to_string())?;
    let runtime = open_runtime(&store, Some(args.engine.llm()?), Vec::new()).await?;
    let config = ExecutorConfig {
        lease_ttl,
        callbacks: args.callback_base_url.map(HttpCallbacks::shared),
        async_tool_timeout: args.engine.async_tool_timeout()?,
        ..ExecutorConfig::default()
    };
    let outcome = process_once_with(
        Arc::new(runtime),
        agent,
        config,
        input,
        Duration::from_secs_f64(args.timeout),
    )
    .await
    .map_err(|err| err.to_string())?;
    println!("{}", outcome.to_json());
    Ok(())
}

/// Whether a `keel serve` flag was given (on the command line or by its variable), so that
/// it overrides the file's `[server]`.
fn given(matches: &ArgMatches, id: &str) -> bool {
    matches!(
        matches.value_source(id),
        Some(clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable)
    )
}

/// The file `keel serve` serves, loaded: the one named, else `./keel.toml` when it exists;
/// `None` (the demo agent) when neither.
fn serve_config(named: Option<PathBuf>) -> Option<Result<keel::config::LoadedConfig, String>> {
    let path = named.or_else(|| {
        Some(PathBuf::from(keel::config::DEFAULT_CONFIG_FILE)).filter(|p| p.exists())
    })?;
    Some(keel::Config::from_path(&path).map_err(|err| err.to_string()))
}

/// `keel serve`: the agents of `file` (as [`serve_config`] loaded it), else the demo agent.
async fn serve(
    args: ServeArgs,
    matches: Option<ArgMatches>,
    file: Option<Result<keel::config::LoadedConfig, String>>,
) -> Result<(), String> {
    if args
        .instance_id
        .as_ref()
        .is_some_and(|id| id.trim().is_empty())
    {
        return Err("--instance-id must not be empty".into());
    }
    if args.metrics_tenant_labels {
        keel::agent::meter::enable_tenant_labels();
    }
    if let Some(loaded) = file {
        let loaded = loaded?;
        if loaded.server.metrics_tenant_labels {
            keel::agent::meter::enable_tenant_labels();
        }
        let matches = matches.unwrap_or_default();
        if matches.value_source("llm") == Some(clap::parser::ValueSource::CommandLine) {
            return Err(
                "--llm does not apply to agents from a file: set `agents[].model.id` in it".into(),
            );
        }
        if matches.value_source("agent") == Some(clap::parser::ValueSource::CommandLine) {
            return Err("--agent does not apply when agents come from a file".into());
        }
        let set = |id: &str| given(&matches, id);
        let overrides = from_file::ServerOverrides {
            host: set("host").then(|| args.host.clone()),
            port: set("port").then_some(args.port),
            public_url: args.public_url.clone(),
            store: set("store").then(|| args.engine.store.clone()),
            redis_prefix: set("redis_prefix").then(|| args.engine.redis_prefix.clone()),
            api_keys: if args.api_keys.is_empty() {
                None
            } else {
                Some(parse_api_keys(&args.api_keys)?)
            },
            allow_private_push_targets: args.allow_private_push_targets,
            push_targets: if args.push_targets.is_empty() {
                None
            } else {
                Some(parse_push_targets(&args.push_targets)?)
            },
            lease_ttl: set("lease_ttl")
                .then(|| args.engine.lease_ttl())
                .transpose()?,
            async_tool_timeout: set("async_tool_timeout")
                .then(|| args.engine.async_tool_timeout())
                .transpose()?,
            drain_timeout: set("drain_timeout")
                .then(|| drain_timeout(args.drain_timeout))
                .transpose()?,
            instance_id: args.instance_id.clone(),
            limits: Limits {
                max_batch_requests: args.max_batch_requests,
                max_message_parts: args.max_message_parts,
                max_requests_per_tenant: args.max_requests_per_tenant,
            },
            max_threads: args.max_threads,
            max_threads_per_tenant: args.max_threads_per_tenant,
            max_queued_per_thread: args.max_queued_per_thread,
            max_queued_per_tenant: args.max_queued_per_tenant,
            connections: args.connection_limits(loaded.server.connection_limits(), set)?,
            metrics: args.metrics,
            console: args.console(),
        };
        return from_file::serve(loaded, overrides).await;
    }
    let lease_ttl = args.engine.lease_ttl()?;
    let store = args.engine.store_config()?;
    let llm = args.engine.llm()?;
    let drain = drain_timeout(args.drain_timeout)?;
    let connections = args.connection_limits(ConnectionLimits::default(), |_| true)?;
    let host = &args.host;
    let addr: SocketAddr = format!("{host}:{}", args.port)
        .parse()
        .or_else(|_| format!("[{host}]:{}", args.port).parse())
        .map_err(|_| {
            format!("`{host}` is not an IP address to listen on (try 127.0.0.1 or 0.0.0.0)")
        })?;
    // Held until the server has stopped: no other `keel serve` runs on this SQLite file.
    // Claimed once the arguments are known good, before the port: two servers started alike
    // are told about the file they share.
    let (_owner, instance_id) = claim_store(&store, args.instance_id.as_deref())?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|err| format!("cannot listen on {addr}: {err}"))?;
    let local = listener.local_addr().map_err(|err| err.to_string())?;
    let agent = match args.agent {
        BuiltinAgent::Demo => keel::demo::agent(),
        BuiltinAgent::Conformance => keel::conformance::agent(),
    }
    .map_err(|err| err.to_string())?;
    let agent_name = agent.card().name.clone();
    let keys = parse_api_keys(&args.api_keys)?;
    let runtime = open_runtime(&store, Some(llm), keys).await?;
    let console = console_served(args.console(), None, local.ip());
    let mut url = args
        .public_url
        .unwrap_or_else(|| format!("http://{local}/"));
    if !url.ends_with('/') {
        url.push('/');
    }
    let mut config = ExecutorConfig {
        lease_ttl,
        // Asynchronous tools call back to the server's own callback route.
        callbacks: Some(HttpCallbacks::shared(url.trim_end_matches('/'))),
        async_tool_timeout: args.engine.async_tool_timeout()?,
        max_concurrent_threads: args.max_threads,
        max_threads_per_tenant: args.max_threads_per_tenant,
        max_queued_per_thread: args.max_queued_per_thread,
        max_queued_per_tenant: args.max_queued_per_tenant,
        drain_timeout: drain,
        ..ExecutorConfig::default()
    };
    if let Some(id) = instance_id {
        config.holder = id;
    }
    let executor = AgentExecutor::with_config(agent, Arc::new(runtime), config);
    let observed = telemetry::observe(None, args.metrics)?;
    let traces = observed.traces;
    if let Some(traces) = &traces {
        executor.add_event_sink(traces.sink());
    }
    // Work a dead process left behind (queued or mid-run tasks) resumes now, for every tenant.
    let resumed = executor
        .recover_all()
        .await
        .map_err(|err| format!("cannot recover unfinished tasks: {err}"))?;
    if resumed > 0 {
        tracing::info!(resumed, "resuming unfinished tasks");
    }
    // Work another process sharing the store leaves behind when it dies is taken over here.
    executor.start_takeover();
    // Scheduled effects: timers due while no process ran fire now, later ones when due.
    executor
        .start_effects()
        .map_err(|err| format!("cannot start the effect scheduler: {err}"))?;
    let mcp_stop = tokio_util::sync::CancellationToken::new();
    let mut server = A2aServer::new(executor.clone())
        .with_public_url(url.clone())
        .allow_private_push_targets(args.allow_private_push_targets)
        .allow_push_targets(parse_push_targets(&args.push_targets)?)
        .with_limits(Limits {
            max_batch_requests: args.max_batch_requests,
            max_message_parts: args.max_message_parts,
            max_requests_per_tenant: args.max_requests_per_tenant,
        })
        .with_connection_limits(connections)
        .with_endpoint(keel::transport::EndpointSpec::compact_thread());
    if !args.api_keys.is_empty() {
        server = server.with_security(Security::api_key_and_bearer());
    }
    if args.agent == BuiltinAgent::Conformance {
        server = keel::conformance::with_extended_card(server);
    }
    server = mcp::mount(server, vec![executor], &url, mcp_stop.clone())?;
    let shutdown = shutdown_signal(drain);
    let shutdown = async move {
        shutdown.await;
        mcp_stop.cancel();
    };
    if let Some(route) = observed.metrics {
        server = server.with_metrics(route);
    }
    if console {
        server = server.with_console(keel::console::router());
    }
    // The first stdout line is the contract for scripts and tests that start `keel serve`.
    println!("keel: serving agent `{agent_name}` at {url} (A2A v1.0 JSON-RPC; card at {url}.well-known/agent-card.json)");
    if console {
        // A log line, not a print: stdout may be closed after its first line (scripts read
        // that line and go), and stderr holds only JSON lines under `--log-format json`.
        tracing::info!(url = %format!("{url}console/"), "console served");
    }
    let served = server
        .serve(listener, shutdown)
        .await
        .map_err(|err| format!("server error: {err}"));
    telemetry::flush_traces(traces).await;
    served?;
    eprintln!("keel: stopped");
    Ok(())
}

/// Whether `keel serve` serves the web console: as the flag says, else as the file's
/// `[server] console` says, else only when it listens on a loopback address (where nobody
/// else reaches it unasked).
pub(crate) fn console_served(flag: Option<bool>, file: Option<bool>, listening: IpAddr) -> bool {
    flag.or(file).unwrap_or(listening.is_loopback())
}

/// `KEY=APP/USER` pairs, each key once.
fn parse_api_keys(specs: &[String]) -> Result<Vec<(String, AuthContext)>, String> {
    let mut keys = Vec::new();
    for spec in specs.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let parsed = spec.split_once('=').and_then(|(key, tenant)| {
            let (app, user) = tenant.split_once('/')?;
            (!key.is_empty() && !app.is_empty() && !user.is_empty())
                .then(|| (key.to_owned(), AuthContext::new(app, user)))
        });
        let Some((key, tenant)) = parsed else {
            return Err(format!(
                "--api-key must look like KEY=APP/USER (got `{}`)",
                spec.split('=').next().unwrap_or_default()
            ));
        };
        if keys.iter().any(|(k, _)| *k == key) {
            return Err("--api-key: the same key is given twice".into());
        }
        keys.push((key, tenant));
    }
    Ok(keys)
}

/// `--push-target` entries, each checked.
fn parse_push_targets(specs: &[String]) -> Result<Vec<PushTarget>, String> {
    specs
        .iter()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|spec| {
            spec.parse()
                .map_err(|reason| format!("--push-target: {reason}"))
        })
        .collect()
}

/// `--drain-timeout`, checked.
fn drain_timeout(seconds: f64) -> Result<Duration, String> {
    keel::config::DRAIN_TIMEOUT_SECONDS
        .check(seconds)
        .map_err(|range| format!("--drain-timeout {seconds} is out of range: {range}"))
}

/// Claim `store` for this process when it is a SQLite file (`StoreOwner`: a second `keel
/// serve` on the same file is refused) and say which instance id names this process in
/// thread leases: `given`, else the one kept beside the SQLite file; on other stores only
/// `given` (the executor's random default otherwise). The claim lasts while the first value
/// lives.
pub(crate) fn claim_store(
    store: &StoreConfig,
    given: Option<&str>,
) -> Result<(Option<keel::sqlite::StoreOwner>, Option<String>), String> {
    match store {
        StoreConfig::Sqlite(path) if path.as_os_str() != ":memory:" => {
            let owner =
                keel::sqlite::StoreOwner::claim(path, given).map_err(|err| err.to_string())?;
            let id = owner.instance_id().to_owned();
            Ok((Some(owner), Some(id)))
        }
        _ => Ok((None, given.map(str::to_owned))),
    }
}

/// Resolves on Ctrl-C or, on Unix, SIGTERM, saying what the shutdown does. The handlers are
/// installed when this is called, not when it is first awaited: call it before announcing the
/// server, so that a signal sent right after the announcement shuts it down gracefully instead
/// of killing it.
pub(crate) fn shutdown_signal(drain: Duration) -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::interrupt()).ok(),
            signal(SignalKind::terminate()).ok(),
        )
    };
    async move {
        #[cfg(unix)]
        {
            // A handler that could not be installed never fires.
            let received = |signal: Option<tokio::signal::unix::Signal>| async move {
                match signal {
                    Some(mut signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let (interrupt, terminate) = signals;
            tokio::select! {
                () = received(interrupt) => {}
                () = received(terminate) => {}
            }
        }
        #[cfg(not(unix))]
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
        eprintln!(
            "keel: shutting down: no new work; running tasks have {} s to reach their next \
             step, then they are handed on (not canceled) to the next process",
            drain.as_secs_f64()
        );
    }
}

#[cfg(test)]
mod console_tests {
    use super::console_served;
    use std::net::IpAddr;

    #[test]
    fn the_console_is_on_by_default_on_loopback_only() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let v6_loopback: IpAddr = "::1".parse().unwrap();
        let anywhere: IpAddr = "0.0.0.0".parse().unwrap();
        assert!(console_served(None, None, loopback));
        assert!(console_served(None, None, v6_loopback));
        assert!(!console_served(None, None, anywhere));
    }

    #[test]
    fn the_flag_wins_over_the_file_which_wins_over_the_address() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let anywhere: IpAddr = "0.0.0.0".parse().unwrap();
        assert!(console_served(None, Some(true), anywhere));
        assert!(!console_served(None, Some(false), loopback));
        assert!(console_served(Some(true), Some(false), anywhere));
        assert!(!console_served(Some(false), Some(true), loopback));
    }
}

#[cfg(test)]
mod config_flag_tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Issue 43, item 13: every command that reads a `keel.toml` takes it as `--config FILE`
    /// (and `KEEL_CONFIG`), `keel check` too; only `keel init` (which writes one) and the
    /// commands that read none are without it.
    #[test]
    fn every_command_that_reads_a_keel_toml_takes_config() {
        let cli = Cli::command();
        let reading: &[&[&str]] = &[
            &["serve"],
            &["check"],
            &["run"],
            &["chat"],
            &["runs", "list"],
            &["runs", "show"],
            &["runs", "export"],
            &["replay"],
            &["test"],
            &["tools"],
            &["mcp"],
            &["threads", "compact"],
        ];
        for path in reading {
            let command = path.iter().fold(&cli, |command, name| {
                command
                    .find_subcommand(name)
                    .unwrap_or_else(|| panic!("keel {path:?}"))
            });
            let config = command
                .get_arguments()
                .find(|arg| arg.get_long() == Some("config"));
            let env = config.and_then(|arg| arg.get_env());
            assert_eq!(
                env.and_then(|env| env.to_str()),
                Some("KEEL_CONFIG"),
                "keel {} takes no --config (KEEL_CONFIG)",
                path.join(" ")
            );
        }
    }
}

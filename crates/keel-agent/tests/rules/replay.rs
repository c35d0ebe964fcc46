// Replay (issue 42) on every backend: a run recorded on the backend (a tool call that needs
// an approval, then an answer) replays unchanged with no divergence, no model call and no
// tool run.

#[tokio::test(flavor = "multi_thread")]
async fn an_unchanged_agent_replays_without_divergence() {
    super::replay_fixture::replay_unchanged(super::runtime()).await;
}

//! `sessions`: the rows a requester may see, or a `leash sessions` query run in the daemon.

use super::cx::*;

fn sessions(d: &Daemon, q: &protocol::SessionsRequest) -> Reply<SessionsAnswer> {
    if let (Some(query), Some(requester)) = (&q.query, &q.requester) {
        return session_query(d, query, requester, &q.scope);
    }
    let rows = d.store().sessions()?;
    let mut live: HashMap<String, protocol::LiveSession> = d
        .all_sessions()
        .iter()
        .map(|s| (s.key.clone(), s.status()))
        .collect();
    // The one visibility check of leash (`leash_core::visibility`), as `leash sessions list` runs it;
    // without a requester, every row (an operator's view).
    let visible: Vec<(&SessionRow, Option<Grant>)> = match &q.requester {
        Some(req) => visible_rows(&rows, req, &q.scope)
            .into_iter()
            .map(|(r, g)| (r, Some(g)))
            .collect(),
        None => rows.iter().map(|r| (r, None)).collect(),
    };
    let out = visible
        .into_iter()
        .map(|(row, grant)| SessionEntry {
            live: live.remove(&row.session_key),
            row: row.clone(),
            visible_as: grant,
        })
        .collect();
    Ok(SessionsAnswer::Rows(out))
}

/// `leash sessions list|history|status` asked of the daemon: the CLI's own operations (the same
/// visibility gate, the same JSON), run here so that the thin client goes through the daemon.
fn session_query(
    d: &Daemon,
    query: &protocol::SessionQuery,
    requester: &str,
    scope: &leash_core::visibility::Scope,
) -> Reply<SessionsAnswer> {
    use crate::controller::sessions::View;
    use protocol::SessionQuery;
    let s = &d.ctl;
    let view = View::new(requester, scope.clone());
    let answer = match query {
        SessionQuery::List => s.list(&view).map(SessionsAnswer::List),
        SessionQuery::History(k) => s.history(&view, k).map(SessionsAnswer::History),
        SessionQuery::Status(k) => s
            .status(&view, k)
            .map(|st| SessionsAnswer::Status(Box::new(st))),
    };
    answer.map_err(|e| kind_fail(&e))
}

impl Handles<SessionsRequest> for Cx<'_> {
    type Done = Timed;

    fn handle(self, q: SessionsRequest) -> Timed {
        let answer = sessions(self.d, &q);
        self.answer::<SessionsRequest>(answer)
    }
}

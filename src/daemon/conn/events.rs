//! `events`: a session's persisted events above a seq.

use super::cx::*;

/// `events`: a session's persisted events above `since` (the controller's `events`);
/// `not_found` for a key that names nothing (as `attach` and `send` answer).
fn events(d: &Daemon, e: &protocol::Events) -> Reply<Vec<crate::store::Event>> {
    d.ctl.events(&e.session, e.since).map_err(|e| kind_fail(&e))
}

impl Handles<Events> for Cx<'_> {
    type Done = Timed;

    fn handle(self, e: Events) -> Timed {
        let events = events(self.d, &e);
        self.answer::<Events>(events)
    }
}

//! `status`: the state root and the daemon.

use super::cx::*;

impl Handles<StatusRequest> for Cx<'_> {
    type Done = Timed;

    fn handle(self, _: StatusRequest) -> Timed {
        let status = self.d.status().map_err(OpError::from);
        self.answer::<StatusRequest>(status)
    }
}

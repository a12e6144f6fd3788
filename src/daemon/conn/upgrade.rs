//! `upgrade`: asks `serve`'s loop for a handoff to a new program of the daemon. The answer comes
//! from whichever program serves after it: the new one, on this connection's descriptor (kept
//! across the exec), or this one when the handoff is refused or undone.

use super::cx::*;
use crate::daemon::ask::{Ask, Refuse};
use crate::protocol::{UpgradeRequest, Upgraded};
use std::os::fd::AsRawFd;

impl Handles<UpgradeRequest> for Cx<'_> {
    type Done = Timed;

    fn handle(self, _: UpgradeRequest) -> Timed {
        let fd = self
            .out
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stream
            .as_raw_fd();
        let (out, id) = (self.out.clone(), self.id.clone());
        let refuse: Refuse = Box::new(move |msg| {
            out.reply::<Upgraded>(&id, Err(fail(Code::Conflict, msg)));
        });
        let ask = Ask {
            at_ns: crate::sys::monotonic_ns(),
            requester: Some((fd, self.id.clone())),
            refuse: Some(refuse),
        };
        match self.d.ask_upgrade(ask) {
            Ok(()) => Timed::WhereReplied,
            Err(msg) => self.answer::<UpgradeRequest>(Err(fail(Code::Conflict, msg))),
        }
    }
}

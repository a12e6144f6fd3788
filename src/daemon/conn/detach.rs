//! `detach`: ends an attach of this connection.

use super::cx::*;

impl Handles<Detach> for Cx<'_> {
    type Done = Timed;

    fn handle(self, x: Detach) -> Timed {
        let detached = self.out.attaches.detach(&x.attach_id);
        self.answer::<Detach>(detached)
    }
}

//! `ping`: the daemon answers.

use super::cx::*;
use crate::protocol::Pong;

fn ping() -> Pong {
    Pong {
        at: crate::lease::now_ms(),
        pong: true,
    }
}

impl Handles<Ping> for Cx<'_> {
    type Done = Timed;

    fn handle(self, _: Ping) -> Timed {
        self.answer::<Ping>(Ok(ping()))
    }
}

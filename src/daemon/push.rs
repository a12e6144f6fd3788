//! Lifecycle pushes: connections that said `hello {"events": true}` get lifecycle items without
//! polling `status`, tagged with their hello's id. Today the one kind is `resumable` (a session
//! that was busy when the previous daemon stopped; see docs/protocol.md, *Shutdown*): a new
//! subscriber gets every session that is resumable right now, and later subscribers likewise.
//!
//! The hub knows nothing about connections: a subscriber is a function that writes one line and
//! says whether the client is still there; gone subscribers are dropped on the next push. The
//! items are [`crate::protocol::StreamItem`]s, rendered with [`crate::protocol::item_body`].

use crate::protocol::stream_line;
use serde_json::Value;
use std::sync::Mutex;

type Sink = Box<dyn Fn(&[u8]) -> bool + Send + Sync>;

struct Subscriber {
    id: Value,
    sink: Sink,
}

#[derive(Default)]
pub struct Hub {
    subs: Mutex<Vec<Subscriber>>,
}

impl Hub {
    /// Adds a subscriber and sends it `initial` (bodies) first, under the hub's lock, so no push
    /// falls between what it was told and what it is told next.
    pub fn subscribe(&self, id: Value, sink: Sink, initial: &[String]) {
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        for body in initial {
            if !sink(&stream_line(&id, body)) {
                return;
            }
        }
        subs.push(Subscriber { id, sink });
    }

    /// Sends one item to every subscriber; drops those that are gone.
    pub fn publish(&self, body: &str) {
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.retain(|s| (s.sink)(&stream_line(&s.id, body)));
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.subs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{item_body, Resumable, StreamItem};
    use std::sync::{Arc, Mutex};

    fn resumable(key: &str) -> String {
        item_body(&StreamItem::Resumable {
            has_spec: false,
            needs_env: Vec::new(),
            entry: Resumable {
                session_key: key.into(),
                rest: serde_json::Map::new(),
            },
        })
    }

    #[test]
    fn subscribers_get_the_initial_items_then_pushes_and_gone_ones_are_dropped() {
        let hub = Hub::default();
        let got = Arc::new(Mutex::new(Vec::<Value>::new()));
        let g = got.clone();
        let body = resumable("a");
        hub.subscribe(
            Value::from(3),
            Box::new(move |line| {
                g.lock()
                    .unwrap()
                    .push(serde_json::from_slice(line).unwrap());
                true
            }),
            std::slice::from_ref(&body),
        );
        hub.subscribe(Value::from(4), Box::new(|_| false), &[]);
        assert_eq!(hub.len(), 2);
        hub.publish(&resumable("b"));
        assert_eq!(hub.len(), 1);
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0],
            serde_json::json!({"id": 3, "type": "resumable", "sessionKey": "a", "hasSpec": false})
        );
        assert_eq!(got[1]["sessionKey"], "b");
    }
}

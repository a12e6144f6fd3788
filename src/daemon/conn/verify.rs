//! `verify`: `leash verify` in the daemon.

use super::cx::*;

/// `leash verify` in the daemon: reads only, never signals.
fn verify(d: &Daemon, t: &LeaseRef) -> Reply<leash_core::answer::VerifyReport> {
    use crate::controller::verify::VerifyError;
    match d.ctl.verify(t) {
        Ok(r) => Ok(r),
        Err(e @ (VerifyError::NoLease(_) | VerifyError::NoSession(_))) => {
            Err(fail(Code::NotFound, e.to_string()))
        }
        Err(VerifyError::Store(e)) => Err(e.into()),
    }
}

impl Handles<Verify> for Cx<'_> {
    type Done = Timed;

    fn handle(self, v: Verify) -> Timed {
        let report = verify(self.d, &v.target);
        self.answer::<Verify>(report)
    }
}

//! `leases`: the rows, as `leash leases` lists them.

use super::cx::*;

fn leases(d: &Daemon, state: Option<&str>) -> Reply<Vec<LeaseRow>> {
    let states: Vec<LeaseState> = state.and_then(|s| s.parse().ok()).into_iter().collect();
    // As `leash leases` runs it: the wrappers' reports folded in first.
    let rows = d.ctl.leases(&states)?;
    Ok(rows.into_iter().map(LeaseRow::from).collect())
}

impl Handles<Leases> for Cx<'_> {
    type Done = Timed;

    fn handle(self, l: Leases) -> Timed {
        let rows = leases(self.d, l.state.as_deref());
        self.answer::<Leases>(rows)
    }
}

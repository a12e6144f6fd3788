//! `metrics`: the OpenMetrics text, as `--metrics` serves it over HTTP.

use super::cx::*;

impl Handles<MetricsRequest> for Cx<'_> {
    type Done = Timed;

    fn handle(self, _: MetricsRequest) -> Timed {
        let text = self.d.render_metrics();
        self.answer::<MetricsRequest>(Ok(MetricsText {
            content_type: "application/openmetrics-text; version=1.0.0".into(),
            text,
        }))
    }
}

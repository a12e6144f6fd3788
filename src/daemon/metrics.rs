//! What the daemon knows, for Prometheus: `leash serve --metrics ADDR` serves it at
//! `GET /metrics` (OpenMetrics text), and the `metrics` op returns the same text over the
//! socket, for hosts without TCP. The exposition is encoded by `prometheus-client` (the
//! Prometheus project's own Rust client), never by hand; HTTP is hyper's, bounded so that no
//! local client can stall a scrape or grow the daemon (`serve_http`). Every counter exists from
//! the start, at 0 for each fixed label value.
//!
//! Counters are bumped where the work happens (close, reap, reconcile, ensure, each request);
//! gauges that describe the present (leases by state, sessions by phase, replay bytes, RSS and
//! CPU of each session's tree) are read at scrape time, so a scrape costs a count query plus one
//! `/proc` read per supervised process — nothing when nobody scrapes.

use crate::controller::{CloseOutcome, CloseResult};
use crate::signal::Delivery;
use leash_core::verify::Role;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SignalLabels {
    pub signal: String,
    pub role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabel {
    pub op: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: String,
    pub busy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SessionLabel {
    pub session: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Every metric of the daemon. Cheap to share: each field is an `Arc` inside.
pub struct Metrics {
    registry: Registry,
    pub leases: Family<StateLabel, Gauge>,
    pub sessions: Family<PhaseLabels, Gauge>,
    pub wrapper_starts: Counter,
    pub report_write_failures: Counter,
    pub closes: Family<ResultLabel, Counter>,
    pub reaps: Family<ResultLabel, Counter>,
    pub signals_sent: Family<SignalLabels, Counter>,
    pub signals_refused: Family<ReasonLabel, Counter>,
    pub escapees_killed: Counter,
    pub startup_reap_seconds: Gauge<f64, AtomicU64>,
    pub reconcile_passes: Family<ResultLabel, Counter>,
    pub reconcile_settled: Family<ResultLabel, Counter>,
    pub reconcile_seconds: Histogram,
    pub requests: Family<OpLabel, Histogram, fn() -> Histogram>,
    pub replay_bytes: Family<SessionLabel, Gauge>,
    pub session_rss: Family<SessionLabel, Gauge>,
    pub session_cpu: Family<SessionLabel, Counter<f64, AtomicU64>>,
    /// Handoffs to a new program of the daemon that took over (`upgrade.rs`).
    pub handoffs: Counter,
    /// Upgrades refused before the exec, or handed back after it.
    pub handoff_failures: Counter,
    /// How long the last handoff took, from the request to the new program's answer.
    pub handoff_seconds: Gauge<f64, AtomicU64>,
}

/// The results of a close or a reap (`result_name`), the labels of `closes`, `reaps` and
/// `reconcile_settled` (which also counts `expired`).
const RESULTS: [&str; 4] = ["closed", "lost", "left_open", "conflict"];
/// The labels of `reconcile_passes`.
const PASS_RESULTS: [&str; 3] = ["idle", "acted", "failed"];
/// Every value `refusal_kind` returns, the labels of `signals_refused`.
const REFUSAL_KINDS: [&str; 7] = [
    "unavailable",
    "already_dead",
    "pid_reused",
    "permission",
    "not_ours",
    "guard",
    "other",
];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("leash");
        let m = Metrics {
            registry: Registry::default(),
            leases: Family::default(),
            sessions: Family::default(),
            wrapper_starts: Counter::default(),
            report_write_failures: Counter::default(),
            closes: Family::default(),
            reaps: Family::default(),
            signals_sent: Family::default(),
            signals_refused: Family::default(),
            escapees_killed: Counter::default(),
            startup_reap_seconds: Gauge::default(),
            reconcile_passes: Family::default(),
            reconcile_settled: Family::default(),
            reconcile_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            requests: Family::new_with_constructor(latency_histogram),
            replay_bytes: Family::default(),
            session_rss: Family::default(),
            session_cpu: Family::default(),
            handoffs: Counter::default(),
            handoff_failures: Counter::default(),
            handoff_seconds: Gauge::default(),
        };
        registry.register(
            "leases",
            "Leases in the state database, by state",
            m.leases.clone(),
        );
        registry.register(
            "sessions",
            "Sessions supervised by this daemon, by phase and busy",
            m.sessions.clone(),
        );
        registry.register(
            "wrapper_starts",
            "Wrappers (sessions) started by this daemon",
            m.wrapper_starts.clone(),
        );
        registry.register(
            "report_write_failures",
            "Sessions whose wrapper could not write its report to the reports directory (full, out of inodes, or gone): it wrote it to the state root's run/, or nowhere",
            m.report_write_failures.clone(),
        );
        registry.register(
            "closes",
            "Leases closed through the daemon (close op, idle close, shutdown), by result",
            m.closes.clone(),
        );
        registry.register(
            "reaps",
            "Leases settled by reaps run in the daemon (startup, reap op, reconcile), by result",
            m.reaps.clone(),
        );
        registry.register(
            "signals_sent",
            "Signals delivered after verification, by signal and the member's role",
            m.signals_sent.clone(),
        );
        registry.register(
            "signals_refused",
            "Processes not signalled because a check failed, by reason",
            m.signals_refused.clone(),
        );
        registry.register(
            "escapees_killed",
            "Processes of a lease outside its wrapper's tree (escapees: found by its markers or its cgroup, not by descent) that were signalled",
            m.escapees_killed.clone(),
        );
        registry.register_with_unit(
            "startup_reap_duration",
            "How long the start-up reap took",
            Unit::Seconds,
            m.startup_reap_seconds.clone(),
        );
        registry.register(
            "reconcile_passes",
            "Reconcile passes, by result (idle, acted, failed)",
            m.reconcile_passes.clone(),
        );
        registry.register(
            "reconcile_settled",
            "Leases settled by reconcile passes, by result",
            m.reconcile_settled.clone(),
        );
        registry.register_with_unit(
            "reconcile_duration",
            "Duration of reconcile passes",
            Unit::Seconds,
            m.reconcile_seconds.clone(),
        );
        registry.register_with_unit(
            "request_duration",
            "Time to the reply of socket requests, by op",
            Unit::Seconds,
            m.requests.clone(),
        );
        registry.register_with_unit(
            "replay_buffer",
            "Bytes held in each session's replay buffer",
            Unit::Bytes,
            m.replay_bytes.clone(),
        );
        registry.register_with_unit(
            "session_rss",
            "Resident memory of each session's process tree",
            Unit::Bytes,
            m.session_rss.clone(),
        );
        registry.register_with_unit(
            "session_cpu",
            "CPU time (user + system) used by each session's process tree: its live processes \
             and the ended ones they waited for",
            Unit::Seconds,
            m.session_cpu.clone(),
        );
        registry.register(
            "handoffs",
            "Handoffs of the daemon to a new program of itself that took over (leash serve --upgrade, SIGHUP)",
            m.handoffs.clone(),
        );
        registry.register(
            "handoff_failures",
            "Upgrades refused before the exec, or handed back to the previous program after it",
            m.handoff_failures.clone(),
        );
        registry.register_with_unit(
            "handoff_duration",
            "How long the last handoff took, from the request to the new program's answer",
            Unit::Seconds,
            m.handoff_seconds.clone(),
        );
        // Counters are exported from the start, at 0, for each fixed label value: a series that
        // appears only at its first event makes `rate()` and `increase()` miss that event and
        // an alert on "absent" indistinguishable from "never happened".
        let result = |r: &str| ResultLabel { result: r.into() };
        for r in RESULTS {
            let _ = m.closes.get_or_create(&result(r));
            let _ = m.reaps.get_or_create(&result(r));
            let _ = m.reconcile_settled.get_or_create(&result(r));
        }
        let _ = m.reconcile_settled.get_or_create(&result("expired"));
        for r in PASS_RESULTS {
            let _ = m.reconcile_passes.get_or_create(&result(r));
        }
        for reason in REFUSAL_KINDS {
            let _ = m.signals_refused.get_or_create(&ReasonLabel {
                reason: reason.into(),
            });
        }
        Metrics { registry, ..m }
    }

    /// Counts the outcomes of closes (`reap == false`) or reaps, with their signals.
    pub fn record_outcomes(&self, outcomes: &[CloseOutcome], reap: bool) {
        let family = if reap { &self.reaps } else { &self.closes };
        for o in outcomes {
            family
                .get_or_create(&ResultLabel {
                    result: result_name(o.result).into(),
                })
                .inc();
            // An escapee is a process of the lease outside its wrapper's tree: one the verifier
            // found by the lease's markers or its cgroup, not by descent from the wrapper (which
            // labels those `root`, `adapter`, `descendant`). Judged by role, not by whether the
            // wrapper's own signal was recorded: a wrapper that exits before its turn has none,
            // and its adapter is no escapee for that.
            let mut escapees = std::collections::HashSet::new();
            for s in &o.signals {
                if s.delivery != Delivery::Delivered {
                    continue;
                }
                self.signals_sent
                    .get_or_create(&SignalLabels {
                        signal: s.signal.name().to_string(),
                        role: format!("{:?}", s.role).to_lowercase(),
                    })
                    .inc();
                if matches!(s.role, Role::Marked | Role::CgroupMember) {
                    escapees.insert((s.pid, s.start_time));
                }
            }
            self.escapees_killed.inc_by(escapees.len() as u64);
            for r in &o.refused {
                self.signals_refused
                    .get_or_create(&ReasonLabel {
                        reason: refusal_kind(&r.reason).into(),
                    })
                    .inc();
            }
        }
    }

    pub fn observe_request(&self, op: &str, took: Duration) {
        self.requests
            .get_or_create(&OpLabel { op: op.to_string() })
            .observe(took.as_secs_f64());
    }

    /// The counters a handoff carries: the plain ones, and the labelled ones read back from the
    /// exposition (prometheus-client lists no family's series otherwise).
    pub fn counters(&self) -> super::handoff::Counters {
        let mut labelled = Vec::new();
        for line in self.encode().lines() {
            if let Some((name, labels, value)) = parse_series(line) {
                if LABELLED_COUNTERS.contains(&name) {
                    labelled.push((name.to_string(), labels, value as u64));
                }
            }
        }
        super::handoff::Counters {
            wrapper_starts: self.wrapper_starts.get(),
            report_write_failures: self.report_write_failures.get(),
            escapees_killed: self.escapees_killed.get(),
            handoffs: self.handoffs.get(),
            handoff_failures: self.handoff_failures.get(),
            labelled,
        }
    }

    /// Counts on from the counters of a handoff.
    pub fn restore(&self, c: &super::handoff::Counters) {
        self.wrapper_starts.inc_by(c.wrapper_starts);
        self.report_write_failures.inc_by(c.report_write_failures);
        self.escapees_killed.inc_by(c.escapees_killed);
        self.handoffs.inc_by(c.handoffs);
        self.handoff_failures.inc_by(c.handoff_failures);
        for (name, labels, v) in &c.labelled {
            let get = |k: &str| {
                labels
                    .iter()
                    .find(|(l, _)| l == k)
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default()
            };
            let result = || ResultLabel {
                result: get("result"),
            };
            match name.as_str() {
                "leash_closes_total" => self.closes.get_or_create(&result()).inc_by(*v),
                "leash_reaps_total" => self.reaps.get_or_create(&result()).inc_by(*v),
                "leash_reconcile_passes_total" => {
                    self.reconcile_passes.get_or_create(&result()).inc_by(*v)
                }
                "leash_reconcile_settled_total" => {
                    self.reconcile_settled.get_or_create(&result()).inc_by(*v)
                }
                "leash_signals_sent_total" => self
                    .signals_sent
                    .get_or_create(&SignalLabels {
                        signal: get("signal"),
                        role: get("role"),
                    })
                    .inc_by(*v),
                "leash_signals_refused_total" => self
                    .signals_refused
                    .get_or_create(&ReasonLabel {
                        reason: get("reason"),
                    })
                    .inc_by(*v),
                _ => 0,
            };
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

pub fn result_name(r: CloseResult) -> &'static str {
    match r {
        CloseResult::Closed => "closed",
        CloseResult::Lost => "lost",
        CloseResult::LeftOpen => "left_open",
        CloseResult::Conflict => "conflict",
    }
}

/// A low-cardinality label for a refusal: the reasons are sentences with pids in them (from
/// `leash_core::guard::Refusal`, the tree check in `verify.rs`, and the OS). The labels:
/// `unavailable` (a fact could not be read), `pid_reused` (the pid names another process now, or
/// one older than the lease), `permission` (another uid, or the OS said no), `not_ours` (another
/// lease's or gateway's marker, or a recycled group id), `already_dead` (a zombie), `guard`
/// (pid 1, leash itself, its own group: never signalled), `other`. `refusal_kinds` in the tests
/// below feeds every known sentence through it.
pub fn refusal_kind(reason: &str) -> &'static str {
    let r = reason.to_lowercase();
    if r.contains("unavailable") || r.contains("cannot read") || r.contains("unreadable") {
        "unavailable"
    } else if r.contains("zombie") {
        "already_dead"
    } else if r.contains("reused")
        || r.contains("start time")
        || r.contains("no longer the verified process")
        || r.contains("before the lease's root")
    {
        "pid_reused"
    } else if r.contains("uid") || r.contains("permission") || r.contains("not permitted") {
        "permission"
    } else if r.contains("marker")
        || r.contains("another lease")
        || r.contains("another gateway")
        || r.contains("group id may have been recycled")
    {
        "not_ours"
    } else if r.contains("never") || r.contains("leash itself") || r.contains("leash's own") {
        "guard"
    } else {
        "other"
    }
}

/// The bounds of the HTTP listener, so that no client can stall a scrape or grow the daemon.
/// A scraper opens one connection per scrape, sends a head of a few hundred bytes at once and
/// reads a reply of a few KiB; anything slower, bigger or more numerous is not a scraper.
/// Connections served at once; at the cap, the oldest one still sending its request head is
/// closed to make room (an idler cannot lock scrapers out), and when every one is being answered
/// the new one is closed.
pub const MAX_CONNECTIONS: usize = 16;
/// The request head (request line and headers) is read into at most this many bytes: hyper's
/// read buffer bound (its minimum is 8 KiB). A longer head is answered 431 and closed.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// The whole request head must arrive within this (hyper's `header_read_timeout`: a whole-head
/// deadline, not one per read, so a trickler of one header a second is cut off too).
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection, from accept to the last byte of its reply, lasts at most this (covers a client
/// that never reads the reply).
pub const CONNECTION_DEADLINE: Duration = Duration::from_secs(10);

type Render = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// Serves `GET /metrics` on `listener` until the process exits, on a thread of its own that
/// runs hyper's HTTP/1 server on a single-threaded tokio runtime (a kept HTTP implementation,
/// not a hand-written parser), within the bounds above. Logs where it serves, and warns when
/// that is not a loopback address: the metrics carry session keys and have no authentication.
pub fn serve_http(listener: TcpListener, render: impl Fn() -> String + Send + Sync + 'static) {
    let addr = listener.local_addr().ok();
    let render: Render = std::sync::Arc::new(render);
    let spawned = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            if let Err(e) = run_http(listener, render) {
                tracing::error!(error = %e, "the metrics listener stopped; metrics are served only by the metrics op now");
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the metrics thread");
        return;
    }
    let Some(addr) = addr else { return };
    tracing::info!(addr = %addr, "serving metrics over HTTP");
    if !addr.ip().to_canonical().is_loopback() {
        tracing::warn!(
            addr = %addr,
            "metrics are served on a non-loopback address without authentication: anyone who \
             can reach it reads the session keys and their memory and CPU use (bind 127.0.0.1 \
             or [::1], or put an authenticating proxy in front)"
        );
    }
}

/// A connection being served: its task, and whether its request head has arrived.
struct Open {
    task: tokio::task::JoinHandle<()>,
    answering: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

fn run_http(listener: TcpListener, render: Render) -> std::io::Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    listener.set_nonblocking(true)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let mut open: std::collections::VecDeque<Open> = Default::default();
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // EMFILE and the like: wait rather than spin.
                    tracing::warn!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            open.retain(|c| !c.task.is_finished());
            if open.len() >= MAX_CONNECTIONS {
                match open
                    .iter()
                    .position(|c| !c.answering.load(Ordering::Relaxed))
                {
                    Some(i) => {
                        tracing::debug!("metrics: connection cap reached; closing the oldest one still sending its request");
                        if let Some(c) = open.remove(i) {
                            c.task.abort();
                        }
                    }
                    None => {
                        tracing::debug!("metrics: connection cap reached, every connection is being answered; closing the new one");
                        drop(stream);
                        continue;
                    }
                }
            }
            let answering = std::sync::Arc::new(AtomicBool::new(false));
            let task = tokio::spawn(connection(stream, render.clone(), answering.clone()));
            open.push_back(Open { task, answering });
        }
    })
}

/// One connection: one request, answered and closed (no keep-alive, so the deadline bounds the
/// whole exchange).
async fn connection(
    stream: tokio::net::TcpStream,
    render: Render,
    answering: std::sync::Arc<std::sync::atomic::AtomicBool>,
) {
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        answering.store(true, std::sync::atomic::Ordering::Relaxed);
        // Rendered on the runtime's one thread: a count query and a /proc read per supervised
        // process, and every other connection waits for the same text anyway.
        let reply = respond(&req, &*render);
        async move { Ok::<_, std::convert::Infallible>(reply) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_DEADLINE, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "metrics request failed"),
        Err(_) => tracing::debug!("metrics connection outlived its deadline; closed"),
    }
}

/// The reply to one request: the metrics at `GET /metrics` (OpenMetrics when the Accept header
/// asks for it, as Prometheus does; else the classic text format, for curl, promtool and older
/// scrapers), 404 at any other path, 405 for another method.
fn respond<B>(req: &hyper::Request<B>, render: &dyn Fn() -> String) -> hyper::Response<String> {
    use hyper::header::{HeaderValue, ACCEPT, ALLOW, CONTENT_TYPE};
    use hyper::{Method, StatusCode};
    let plain = |status: StatusCode, body: &str| {
        let mut r = hyper::Response::new(body.to_string());
        *r.status_mut() = status;
        r.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        r
    };
    if req.uri().path() != "/metrics" {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: the metrics are at /metrics\n",
        );
    }
    if req.method() != Method::GET {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    let openmetrics = req.headers().get_all(ACCEPT).iter().any(|v| {
        v.to_str().is_ok_and(|v| {
            v.to_ascii_lowercase()
                .contains("application/openmetrics-text")
        })
    });
    let (body, ctype) = if openmetrics {
        (
            render(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
    } else {
        (
            to_prometheus_text(&render()),
            "text/plain; version=0.0.4; charset=utf-8",
        )
    };
    let mut r = hyper::Response::new(body);
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

/// The OpenMetrics exposition in the classic Prometheus text format (0.0.4), for clients that
/// do not ask for OpenMetrics: a counter family is named with its `_total` suffix in HELP and
/// TYPE (as its samples are), and the OpenMetrics-only `# UNIT` and `# EOF` lines go. Pure.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Parses `--metrics ADDR`: `host:port` (`127.0.0.1:9464`, `[::1]:9464`) or a bare port on
/// loopback.
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    s.parse().map_err(|_| {
        format!("'{s}' is not an address to listen on (use e.g. 127.0.0.1:9464 or a port)")
    })
}

/// Refreshes the gauges that describe the present, then encodes everything.
pub(super) fn render(
    m: &Metrics,
    counts: Result<crate::store::Counts, crate::store::StoreError>,
    sessions: &[std::sync::Arc<super::session::Supervised>],
) -> String {
    match counts {
        Ok(c) => {
            // Every state, from the one list of them (a state added there is exported here).
            for state in leash_core::model::LeaseState::ALL {
                m.leases
                    .get_or_create(&StateLabel {
                        state: state.as_str().into(),
                    })
                    .set(c.get(state) as i64);
            }
        }
        Err(e) => tracing::warn!(error = %e, "metrics: cannot count the leases"),
    }
    // Series of sessions that ended are dropped, so a scrape shows only what exists. The CPU
    // counter is rebuilt from /proc the same way: a new counter incremented once by the tree's
    // cumulative total is that total (prometheus-client has no settable counter, and the value
    // is read here, at scrape time, not counted as it happens).
    m.sessions.clear();
    m.replay_bytes.clear();
    m.session_rss.clear();
    m.session_cpu.clear();
    for phase in ["starting", "running", "closing", "ended"] {
        for busy in ["true", "false"] {
            let _ = m.sessions.get_or_create(&PhaseLabels {
                phase: phase.into(),
                busy: busy.into(),
            });
        }
    }
    for s in sessions {
        let st = s.status();
        let phase = format!("{:?}", st.phase).to_lowercase();
        m.sessions
            .get_or_create(&PhaseLabels {
                phase,
                busy: st.busy.to_string(),
            })
            .inc();
        if st.phase == crate::protocol::Phase::Ended {
            continue;
        }
        let label = SessionLabel {
            session: st.session_key.clone(),
        };
        m.replay_bytes
            .get_or_create(&label)
            .set(st.buffered_bytes as i64);
        if let (Some(root), crate::protocol::Phase::Starting | crate::protocol::Phase::Running) =
            (st.root_pid, st.phase)
        {
            if let Some((rss, cpu)) = tree_usage(root) {
                m.session_rss.get_or_create(&label).set(rss as i64);
                m.session_cpu.get_or_create(&label).inc_by(cpu);
            }
        }
    }
    m.encode()
}

/// The labelled counters a handoff carries, by their exposed name.
const LABELLED_COUNTERS: &[&str] = &[
    "leash_closes_total",
    "leash_reaps_total",
    "leash_reconcile_passes_total",
    "leash_reconcile_settled_total",
    "leash_signals_sent_total",
    "leash_signals_refused_total",
];

/// One series of the text exposition: `name{k="v",…} value` (label values without quotes or
/// commas, as this daemon's are).
fn parse_series(line: &str) -> Option<(&str, super::handoff::Labels, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((n, rest)) => (n, rest.strip_suffix('}')?),
        None => (series, ""),
    };
    let labels = labels
        .split(',')
        .filter(|l| !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.split_once('=')?;
            Some((k.to_string(), v.trim_matches('"').to_string()))
        })
        .collect();
    Some((name, labels, value))
}

/// Resident bytes and CPU seconds of `root` and its descendants (`None` when the root is gone).
/// The CPU includes each process's waited-for children (`cutime`, `cstime`), so a child that
/// ends and is reaped inside the tree moves its time to its parent instead of taking it away:
/// the total only grows while the root lives, as a counter must.
fn tree_usage(root: i32) -> Option<(u64, f64)> {
    use crate::proc::ProcessTable;
    let tree = crate::proc::LiveTable.subtree(root).ok()?;
    let page = procfs::page_size();
    let ticks = procfs::ticks_per_second() as f64;
    let (mut rss, mut cpu) = (0u64, 0f64);
    let mut any = false;
    for p in tree.iter() {
        let Ok(stat) = procfs::process::Process::new(p.pid).and_then(|pr| pr.stat()) else {
            continue;
        };
        if stat.starttime != p.start_time {
            continue;
        }
        any = true;
        rss += stat.rss * page;
        cpu += (stat.utime + stat.stime) as f64 / ticks;
        cpu += (stat.cutime + stat.cstime).max(0) as f64 / ticks;
    }
    any.then_some((rss, cpu))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_names_every_family() {
        let m = Metrics::new();
        m.wrapper_starts.inc();
        m.leases
            .get_or_create(&StateLabel {
                state: "open".into(),
            })
            .set(3);
        m.observe_request("status", Duration::from_millis(2));
        let text = m.encode();
        for name in [
            "leash_wrapper_starts_total 1",
            "leash_request_duration_seconds_bucket{",
            "leash_leases{state=\"open\"} 3",
            "# EOF",
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
    }

    #[test]
    fn classic_text_names_counters_with_their_suffix() {
        let m = Metrics::new();
        m.wrapper_starts.inc();
        let text = to_prometheus_text(&m.encode());
        assert!(
            text.contains("# TYPE leash_wrapper_starts_total counter\n"),
            "{text}"
        );
        assert!(
            text.contains("# HELP leash_wrapper_starts_total "),
            "{text}"
        );
        assert!(text.contains("leash_wrapper_starts_total 1\n"), "{text}");
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
    }

    #[test]
    fn refusal_kinds() {
        use leash_core::guard::Refusal;
        for (reason, kind) in [
            (Refusal::PidTooLow { pid: 1 }.to_string(), "guard"),
            (Refusal::OwnPid { pid: 7 }.to_string(), "guard"),
            (Refusal::OwnGroupLeader { pid: 7 }.to_string(), "guard"),
            (Refusal::Group { pgid: 7 }.to_string(), "guard"),
            (
                Refusal::ForeignUid {
                    pid: 7,
                    uid: 65534,
                    ours: 0,
                }
                .to_string(),
                "permission",
            ),
            (
                Refusal::Changed {
                    pid: 7,
                    found: 2,
                    expected: 1,
                }
                .to_string(),
                "pid_reused",
            ),
            (
                crate::signal::SignalError::Os {
                    pid: 7,
                    source: std::io::Error::from_raw_os_error(libc::EPERM),
                }
                .to_string(),
                "permission",
            ),
            // The tree check's sentences (src/verify.rs).
            ("pid 1 can never be a lease member".into(), "guard"),
            (
                "started at 5 before the lease's root (9): cannot be its member".into(),
                "pid_reused",
            ),
            (
                "runs as uid 65534, the lease's root as uid 0".into(),
                "permission",
            ),
            (
                "carries another lease's marker (x of gateway y)".into(),
                "not_ours",
            ),
            ("carries another gateway's instance id".into(), "not_ours"),
            (
                "zombie: already dead, its parent reaps it".into(),
                "already_dead",
            ),
            (
                "in the lease's process group but not a descendant of its root and without its \
                 marker: the group id may have been recycled"
                    .into(),
                "not_ours",
            ),
            (
                "in the lease's process group but not a descendant of its root, and its \
                 environment is unreadable"
                    .into(),
                "unavailable",
            ),
        ] {
            assert_eq!(refusal_kind(&reason), kind, "{reason}");
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(
            parse_addr("9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert!(parse_addr("[::1]:9").is_ok());
        assert!(parse_addr("localhost").is_err());
    }
}

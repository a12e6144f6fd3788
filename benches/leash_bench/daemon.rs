//! The daemon under load: each figure next to a baseline measured in the same round,
//! on the quiet host and again with 2,000 unrelated `sleep` processes that this section starts
//! (and kills, by pid, at the end).
//!
//! - **Relay** (its own section, `--only relay`): one session's output through `leash serve` to one attached client, against the
//!   same generator (`yes` of 100-byte and 1 KiB lines, `head -n N`) read from a plain pipe. The
//!   reader is the same code on both sides: this process reads 64 KiB at a time and counts
//!   newlines, so the ratio is the daemon's share alone. Each turn also takes a plain relay (the
//!   host's floor for any relay) and a second pipe round (the per-round ratio's own noise).
//! - **`status` under load**: 100 sessions printing as fast as a shell loop can (bursts of
//!   2,000 lines every 20 ms each); `status` latency p50/p99 against `ping` (a request that does
//!   no work) on the same connection, interleaved. Target: `status` p99 ≤ 50 ms.
//! - **Memory per session**: the daemon's resident memory and threads with 0, 100 and 1,000 idle
//!   sessions (`sleep`), and the difference per session.

use crate::procs::{self, Children, TempDir, Tracked};
use crate::stats::{self, Summary, Table};
use crate::{Config, Env};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub fn run(env: &Env, cfg: &Config) -> Result<String, String> {
    let mut out = String::from("\n### The daemon: `status` under load, memory per session\n\n");
    let mut status = Table::new(&[
        "host",
        "sessions printing",
        "status p50",
        "status p99",
        "ping p50",
        "ping p99",
        "target (status p99)",
    ]);
    let sleepers_n = if cfg.quick { 200 } else { 2_000 };
    for crowd in [0, sleepers_n] {
        let mut sleepers = Children::new();
        sleepers.grow_sleepers(&env.sleep, crowd)?;
        let host = host_name(crowd);
        let n = if cfg.quick { 20 } else { 100 };
        let (st, ping) = status_under_load(env, cfg, n)?;
        let p99 = stats::percentile(&st, 99.0);
        status.row(vec![
            host.clone(),
            n.to_string(),
            stats::ms(stats::percentile(&st, 50.0)),
            stats::ms(p99),
            stats::ms(stats::percentile(&ping, 50.0)),
            stats::ms(stats::percentile(&ping, 99.0)),
            format!("≤ 50 ms {}", if p99 <= 50.0 { "met" } else { "missed" }),
        ]);
        drop(sleepers);
    }
    out.push_str("`status` while sessions print as fast as they can, against `ping` on the same connection (interleaved, 50 ms apart).\n\n");
    out.push_str(&status.render());
    out.push_str(&memory(env, cfg)?);
    Ok(out)
}

fn host_name(crowd: usize) -> String {
    if crowd == 0 {
        "quiet".to_string()
    } else {
        format!("+{crowd} sleeps")
    }
}

/// The relay section: one session's output through `leash serve` to one attached
/// client against the same generator read from a pipe, every round reported with its ratio and
/// whether it is ≥ 0.8×; quiet and with 2,000 idle unrelated processes.
pub fn relay(env: &Env, cfg: &Config) -> Result<String, String> {
    let mut out =
        String::from("\n### Relay: one session to one attached client against a pipe\n\n");
    let mut relay = Table::new(&[
        "host",
        "line",
        "pipe (lines/s)",
        "through the daemon (lines/s)",
        "relay / pipe",
        "each round",
        "target",
        "plain relay / pipe, each round",
        "a second pipe round / the first, each round",
    ]);
    let sleepers_n = if cfg.quick { 200 } else { 2_000 };
    for crowd in [0, sleepers_n] {
        let mut sleepers = Children::new();
        sleepers.grow_sleepers(&env.sleep, crowd)?;
        let host = host_name(crowd);
        for line_len in [100usize, 1024] {
            let load = loadavg1();
            let RelayRates {
                pipe,
                daemon,
                floor,
                pipe_again,
            } = relay_rounds(env, cfg, line_len)?;
            let ratios = per_round(&daemon, &pipe);
            let r = Summary::of(&ratios);
            let met = ratios.iter().filter(|&&x| x >= 0.8).count();
            relay.row(vec![
                format!("{host} (load {load:.1})"),
                format!("{line_len} B"),
                Summary::of(&pipe).show(rate),
                Summary::of(&daemon).show(rate),
                r.show(stats::ratio),
                each_round(&ratios),
                format!(
                    "≥ 0.8× every round: {met}/{} {}",
                    ratios.len(),
                    if met == ratios.len() {
                        "**met**"
                    } else {
                        "**missed**"
                    }
                ),
                each_round(&per_round(&floor, &pipe)),
                each_round(&per_round(&pipe_again, &pipe)),
            ]);
        }
        drop(sleepers);
    }
    out.push_str("`yes` lines through `leash serve` to one attached raw-socket reader, against the same generator read from a pipe by the same reader code, one pipe round and one daemon round in turn; median (min–max) over rounds and every round's ratio (✗: below 0.8×), after two rounds that fill the replay buffer (not counted: until it is full every item is fresh memory). The load is the 1-minute average when the row started. The last column is the host's floor for any relay, from the same rounds: the same lines through a plain relay (this binary, `--role relay-floor`: one thread reading the pipe and writing each line framed as the daemon frames it, seq and escaping included, to a Unix socket, with no replay buffer), read by the same reader code. The column after it is the measurement's own noise: a second pipe round, taken last in each turn, over the first: a round of 200,000 lines lasts 25–500 ms here, and the per-round ratio moves with the host's scheduling even between two identical pipes.\n\n");
    out.push_str(&relay.render());
    Ok(out)
}

/// Each round's rate over the pipe's in the same round.
fn per_round(rates: &[f64], pipe: &[f64]) -> Vec<f64> {
    rates.iter().zip(pipe).map(|(x, p)| x / p).collect()
}

/// Every round's ratio, marked ✗ below 0.8×.
fn each_round(ratios: &[f64]) -> String {
    ratios
        .iter()
        .map(|&x| format!("{}{}", stats::ratio(x), if x >= 0.8 { "" } else { " ✗" }))
        .collect::<Vec<_>>()
        .join(", ")
}

fn loadavg1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

fn rate(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.2} M", v / 1e6)
    } else {
        format!("{:.0} k", v / 1e3)
    }
}

/// A `leash serve` of this section on its own state root; terminated (its sessions closed) on
/// drop, and whatever of its sessions' trees is left is killed by pid.
pub(crate) struct Serve {
    _dir: TempDir,
    socket: PathBuf,
    children: Children,
    tracked: Tracked,
    pid: i32,
}

impl Serve {
    pub(crate) fn start(env: &Env, args: &[&str]) -> Result<Serve, String> {
        let dir = TempDir::new("daemon");
        let state = dir.path().join("state");
        let child = Command::new(&env.leash)
            .arg("--state-dir")
            .arg(&state)
            .arg("serve")
            .args(args)
            .env("LEASH_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start leash serve: {e}"))?;
        let pid = child.id() as i32;
        let mut children = Children::new();
        children.push(child);
        let socket = state.join("leash.sock");
        if !procs::wait_for(Duration::from_secs(30), || {
            UnixStream::connect(&socket).is_ok()
        }) {
            return Err("leash serve did not listen within 30 s".into());
        }
        Ok(Serve {
            _dir: dir,
            socket,
            children,
            tracked: Tracked::new(),
            pid,
        })
    }

    pub(crate) fn connect(&self) -> Result<Client, String> {
        let s = UnixStream::connect(&self.socket).map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(120)))
            .map_err(|e| e.to_string())?;
        Ok(Client {
            w: s.try_clone().map_err(|e| e.to_string())?,
            r: BufReader::with_capacity(64 * 1024, s),
            next: 0,
        })
    }

    pub(crate) fn ensure(
        &mut self,
        c: &mut Client,
        key: &str,
        argv: &[&str],
    ) -> Result<Value, String> {
        let r = c.call(
            "ensure",
            json!({"session": key, "argv": argv, "graceMs": 200}),
        )?;
        if let Some(pid) = r["rootPid"].as_i64() {
            self.tracked.add_tree(pid as i32);
        }
        Ok(r)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(c) = self.children.list.first() {
            procs::term_child(c);
        }
        self.children.finish(Duration::from_secs(60));
        self.tracked.kill_all();
    }
}

pub(crate) struct Client {
    w: UnixStream,
    r: BufReader<UnixStream>,
    next: u64,
}

impl Client {
    fn request(&mut self, op: &str, mut fields: Value) -> Result<u64, String> {
        self.next += 1;
        fields["id"] = json!(self.next);
        fields["op"] = json!(op);
        let mut line = serde_json::to_vec(&fields).expect("serialisable");
        line.push(b'\n');
        self.w.write_all(&line).map_err(|e| format!("{op}: {e}"))?;
        Ok(self.next)
    }

    fn reply(&mut self, id: u64) -> Result<Value, String> {
        loop {
            let mut line = String::new();
            if self.r.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                return Err("the daemon closed the connection".into());
            }
            let v: Value = serde_json::from_str(&line).map_err(|e| e.to_string())?;
            if v["id"] == json!(id) && v.get("ok").is_some() {
                return Ok(v);
            }
        }
    }

    pub(crate) fn call(&mut self, op: &str, fields: Value) -> Result<Value, String> {
        let id = self.request(op, fields)?;
        let v = self.reply(id)?;
        if v["ok"] != true {
            return Err(format!("{op} failed: {v}"));
        }
        Ok(v["result"].clone())
    }
}

/// Counts newlines read from `r` until `n` were seen (64 KiB reads, like the pipe side).
fn count_lines(r: &mut impl Read, n: usize) -> Result<(), String> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut seen = 0;
    while seen < n {
        let k = r.read(&mut buf).map_err(|e| e.to_string())?;
        if k == 0 {
            return Err(format!("the stream ended after {seen} of {n} lines"));
        }
        seen += newlines(&buf[..k]);
    }
    Ok(())
}

/// The number of newlines in `b`, summed 64 bytes at a time into a byte (a loop the compiler
/// vectorises: ~20 GB/s on the bench VM). The plain `filter(..).count()` it replaces ran at
/// ~1.8 GB/s, which made the reader a third of a CPU at the pipe's pace on 1 KiB lines, and
/// charged the daemon side more for the same lines (its JSON lines are 1.05–1.45× the bytes).
fn newlines(b: &[u8]) -> usize {
    let mut blocks = b.chunks_exact(64);
    let mut n = 0;
    for c in &mut blocks {
        n += c.iter().map(|&x| u8::from(x == b'\n')).sum::<u8>() as usize;
    }
    n + blocks.remainder().iter().filter(|&&x| x == b'\n').count()
}

/// The plain relay (`--role relay-floor`): stdin (the generator's pipe) to stdout (a Unix socket
/// to the bench's reader), each line framed as the daemon frames an output item
/// (`{"id":1,"seq":N,"type":"output","line":…}`, escaped as JSON), one thread, nothing kept.
/// What any relay with a process in the middle costs on this host.
pub fn relay_floor() -> i32 {
    let mut input = std::io::stdin().lock();
    let mut output = std::io::stdout().lock();
    let mut buf = vec![0u8; 128 * 1024];
    let mut partial: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut seq: u64 = 0;
    let mut frame = |line: &[u8], out: &mut Vec<u8>| {
        seq += 1;
        out.extend_from_slice(b"{\"id\":1,\"seq\":");
        let _ = write!(out, "{seq}");
        out.extend_from_slice(b",\"type\":\"output\",\"line\":");
        let escape = line
            .iter()
            .fold(false, |a, &b| a | (b < 0x20) | (b == b'"') | (b == b'\\'));
        match std::str::from_utf8(line) {
            Ok(s) if !escape => {
                out.push(b'"');
                out.extend_from_slice(s.as_bytes());
                out.push(b'"');
            }
            _ => {
                let s = String::from_utf8_lossy(line);
                out.extend_from_slice(serde_json::to_string(&s).expect("strings").as_bytes());
            }
        }
        out.extend_from_slice(b"}\n");
    };
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return 1,
        };
        let mut rest = &buf[..n];
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if partial.is_empty() {
                frame(&rest[..i], &mut out);
            } else {
                partial.extend_from_slice(&rest[..i]);
                frame(&partial, &mut out);
                partial.clear();
            }
            rest = &rest[i + 1..];
        }
        partial.extend_from_slice(rest);
        if output.write_all(&out).is_err() {
            return 1;
        }
        out.clear();
    }
    if !partial.is_empty() {
        frame(&partial, &mut out);
    }
    i32::from(
        output
            .write_all(&out)
            .and_then(|()| output.flush())
            .is_err(),
    )
}

/// Lines per second of each counted round.
struct RelayRates {
    pipe: Vec<f64>,
    daemon: Vec<f64>,
    /// Through the plain relay ([`relay_floor`]).
    floor: Vec<f64>,
    /// The pipe again, last in each turn: the per-round ratio's own noise.
    pipe_again: Vec<f64>,
}

/// Lines per second from a pipe, through the plain relay, through the daemon and from the pipe
/// again, one of each per round in that order.
fn relay_rounds(env: &Env, cfg: &Config, line_len: usize) -> Result<RelayRates, String> {
    let this = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    let n: usize = if cfg.quick { 20_000 } else { 200_000 };
    let rounds = if cfg.quick { 2 } else { 5 };
    let text = "x".repeat(line_len - 1);
    let gen = format!("yes {text} | head -n {n}");
    let lines = (2 * n).to_string();
    let bytes = (n * (line_len + 200) * 2).to_string();
    let mut serve = Serve::start(env, &["--replay-lines", &lines, "--replay-bytes", &bytes])?;
    let mut c = serve.connect()?;
    // Each line on stdin starts one burst.
    let looped = format!("while read go; do {gen}; done");
    serve.ensure(&mut c, "relay", &["sh", "-c", &looped])?;
    let mut a = serve.connect()?;
    let mut pipe = Vec::new();
    let mut daemon = Vec::new();
    let mut floor = Vec::new();
    let mut pipe_again = Vec::new();
    // One round of the generator read from a pipe: lines per second.
    let pipe_round = || -> Result<f64, String> {
        let t = Instant::now();
        let mut p = Command::new("sh")
            .args(["-c", &gen])
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the generator: {e}"))?;
        count_lines(p.stdout.as_mut().expect("piped"), n)?;
        let rate = n as f64 / t.elapsed().as_secs_f64();
        let _ = p.wait();
        Ok(rate)
    };
    // The first two rounds fill the replay buffer (it holds two rounds) and are not counted:
    // until it is full every item is memory the kernel has not given the daemon yet, a cost a
    // running daemon pays once, after which evicted items make room for new ones.
    const WARM_UP: usize = 2;
    for round in 0..WARM_UP + rounds {
        let counted = round >= WARM_UP;
        let rate = pipe_round()?;
        if counted {
            pipe.push(rate);
        }

        // The plain relay, to a socket read by the same code.
        let (mut r, w) =
            UnixStream::pair().map_err(|e| format!("cannot make a socket pair: {e}"))?;
        let t = Instant::now();
        let mut f = Command::new("sh")
            .args(["-c", &format!("{gen} | \"$0\" --role relay-floor")])
            .arg(&this)
            .stdout(Stdio::from(std::os::fd::OwnedFd::from(w)))
            .spawn()
            .map_err(|e| format!("cannot start the plain relay: {e}"))?;
        count_lines(&mut r, n)?;
        if counted {
            floor.push(n as f64 / t.elapsed().as_secs_f64());
        }
        let _ = f.wait();

        let last = c.call("status", json!({}))?["daemon"]["sessions"][0]["lastSeq"]
            .as_i64()
            .unwrap_or(0);
        let id = a.request("attach", json!({"session": "relay", "since": last}))?;
        let r = a.reply(id)?;
        if r["ok"] != true {
            return Err(format!("attach failed: {r}"));
        }
        let t = Instant::now();
        c.call("send", json!({"session": "relay", "line": "go"}))?;
        count_lines(&mut a.r, n)?;
        if counted {
            daemon.push(n as f64 / t.elapsed().as_secs_f64());
        }
        a.call("detach", json!({"attachId": id}))
            .or_else(|_| a.call("detach", json!({"attachId": id.to_string()})))
            .ok();
        // A fresh connection per round: the detached stream's last lines are not read.
        a = serve.connect()?;

        let rate = pipe_round()?;
        if counted {
            pipe_again.push(rate);
        }
    }
    Ok(RelayRates {
        pipe,
        daemon,
        floor,
        pipe_again,
    })
}

/// `status` and `ping` latencies (ms) while `n` sessions print as fast as a shell loop can.
fn status_under_load(env: &Env, cfg: &Config, n: usize) -> Result<(Vec<f64>, Vec<f64>), String> {
    let mut serve = Serve::start(env, &[])?;
    let mut c = serve.connect()?;
    for i in 0..n {
        serve.ensure(
            &mut c,
            &format!("p{i}"),
            &[
                "sh",
                "-c",
                "sleep 1; while :; do seq 1 2000; sleep 0.02; done",
            ],
        )?;
    }
    std::thread::sleep(Duration::from_secs(3));
    let samples = if cfg.quick { 30 } else { 150 };
    let mut st = Vec::new();
    let mut ping = Vec::new();
    for _ in 0..samples {
        for (op, into) in [("status", &mut st), ("ping", &mut ping)] {
            let t = Instant::now();
            c.call(op, json!({}))?;
            into.push(t.elapsed().as_secs_f64() * 1e3);
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok((st, ping))
}

/// Resident memory (KiB) and threads of a process.
fn rss_threads(pid: i32) -> Option<(f64, usize)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((field("VmRSS:")?, field("Threads:")? as usize))
}

fn memory(env: &Env, cfg: &Config) -> Result<String, String> {
    let counts: &[usize] = if cfg.quick { &[20] } else { &[100, 1_000] };
    let mut t = Table::new(&[
        "idle sessions",
        "daemon RSS",
        "threads",
        "RSS per session",
        "threads per session",
    ]);
    for &n in counts {
        let mut serve = Serve::start(env, &["--ensure-wait-ms", "0"])?;
        let mut c = serve.connect()?;
        c.call("status", json!({}))?;
        let (rss0, th0) = rss_threads(serve.pid).ok_or("the daemon is gone")?;
        for i in 0..n {
            serve.ensure(&mut c, &format!("i{i}"), &["sleep", "3600"])?;
        }
        // One status (as a health check would) so the figure includes its buffers.
        c.call("status", json!({}))?;
        std::thread::sleep(Duration::from_secs(1));
        let (rss, th) = rss_threads(serve.pid).ok_or("the daemon is gone")?;
        t.row(vec![
            n.to_string(),
            stats::mb(rss),
            th.to_string(),
            format!("{:.0} KiB", (rss - rss0) / n as f64),
            format!("{:.1}", (th - th0) as f64 / n as f64),
        ]);
    }
    Ok(format!(
        "\nMemory of `leash serve` with idle sessions (`sleep`), RSS from `/proc/<pid>/status`; per session: the difference to the same daemon with none, divided by the sessions.\n\n{}",
        t.render()
    ))
}

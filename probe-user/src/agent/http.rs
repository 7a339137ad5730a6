//! The agent's HTTP endpoints: a deliberately small HTTP/1.1 server on tokio (GET only, one
//! request per connection, bounded request size and time), on a thread of its own so scrapes
//! are answered while the session drains events. A full HTTP stack (hyper) would add a dozen
//! crates for four read-only endpoints.
//!
//! Limits (docs/security.md, "The node agent"): at most [`MAX_CONNECTIONS`] at once (no
//! connection is accepted beyond, so a client that keeps reopening them cannot take the
//! descriptors the tracing side needs), a pause instead of a spin when `accept` fails for
//! want of descriptors, and a `Host` check against DNS rebinding.

use std::{
    net::TcpListener as StdListener,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::Result;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
    sync::watch,
};

use super::{metrics, pprof, state::Shared};
use crate::log;

/// Requests larger than this are refused (a GET line and headers need far less).
const MAX_REQUEST: usize = 16 * 1024;
/// A client gets this long to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more wait in the kernel's backlog, holding no descriptor of
/// ours. Prometheus and a pprof client need one or two.
pub const MAX_CONNECTIONS: usize = 32;
/// The pause after `accept` failed for want of descriptors or memory, instead of retrying
/// at once (a spin at full CPU that starves the session of time).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The names a request's `Host` may carry: what a browser sends for a page of an attacker's
/// domain that was rebound to this node is refused.
#[derive(Clone, Debug, Default)]
pub struct AllowedHosts {
    names: Vec<String>,
}

impl AllowedHosts {
    /// `localhost`, this host's own name (short and as set) and `extra`; IP literals always.
    pub fn new(extra: &[String]) -> AllowedHosts {
        let mut names: Vec<String> = vec!["localhost".into()];
        let mut buf = [0u8; 256];
        // SAFETY: gethostname writes at most buf.len() bytes into buf.
        if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
            let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
            if let Ok(h) = std::str::from_utf8(&buf[..end]) {
                names.push(h.to_owned());
                names.extend(h.split('.').next().map(str::to_owned));
            }
        }
        names.extend(extra.iter().cloned());
        for n in &mut names {
            n.make_ascii_lowercase();
        }
        AllowedHosts { names }
    }

    /// Whether a request with this `Host` header (None: an HTTP/1.0 client sent none) is
    /// answered.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let Some(host) = host else { return true };
        let host = host.trim();
        // `[v6]:port`, `[v6]`, `name:port`, `v4:port`, `name`.
        let name = match host.strip_prefix('[') {
            Some(rest) => match rest.split_once(']') {
                Some((v6, _)) => return v6.parse::<std::net::Ipv6Addr>().is_ok(),
                None => return false,
            },
            None => host.rsplit_once(':').map_or(host, |(n, _)| n),
        };
        if name.parse::<std::net::Ipv4Addr>().is_ok() {
            return true;
        }
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        self.names.contains(&name)
    }
}

/// The value of header `name` of a request head, if any.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

fn text(status: u16, body: impl Into<String>) -> Response {
    Response {
        status,
        content_type: "text/plain; charset=utf-8",
        body: body.into().into_bytes(),
    }
}

/// Answers one request target (`/metrics`, `/debug/pprof/heap?pid=7`, ...); `accept` is the
/// request's `Accept` header (`/metrics` speaks OpenMetrics or the 0.0.4 text format).
pub fn route(
    shared: &Arc<Shared>,
    sample_bytes: u64,
    target: &str,
    accept: Option<&str>,
) -> Response {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/metrics" => {
            let format = metrics::Format::negotiate(accept);
            Response {
                status: 200,
                content_type: format.content_type(),
                body: metrics::render(shared, format).into_bytes(),
            }
        }
        "/ready" => {
            if shared.ready.load(Ordering::Relaxed) {
                text(200, "ready\n")
            } else {
                text(503, "starting: probes not in place yet\n")
            }
        }
        "/debug/pprof/heap" => {
            let pid = query
                .split('&')
                .find_map(|kv| kv.strip_prefix("pid="))
                .map(|v| v.parse::<u32>());
            let procs = shared.processes.lock().unwrap_or_else(|e| e.into_inner());
            let body = match pid {
                None => pprof::heap_profile(procs.values(), sample_bytes),
                Some(Ok(pid)) => match procs.get(&pid) {
                    Some(p) => pprof::heap_profile(std::iter::once(p), sample_bytes),
                    None => return text(404, format!("no traced process {pid}\n")),
                },
                Some(Err(_)) => return text(400, "pid must be a process id\n"),
            };
            Response {
                status: 200,
                content_type: "application/octet-stream",
                body,
            }
        }
        "/debug/memory_snapshot" => memory_snapshot(shared, query),
        "/" => text(
            200,
            "memscope-bpf agent\n/metrics\n/ready\n/debug/pprof/heap[?pid=PID]\n\
             /debug/memory_snapshot?pid=PID\n",
        ),
        _ => text(404, "not found; see /\n"),
    }
}

/// `/debug/memory_snapshot?pid=PID` (`--memory-snapshot`): the pickle for memory_viz.
fn memory_snapshot(shared: &Shared, query: &str) -> Response {
    let Some(snapshots) = &shared.memory_snapshots else {
        return text(
            404,
            "memory snapshots are off: start the agent with --memory-snapshot\n",
        );
    };
    let pid = match query.split('&').find_map(|kv| kv.strip_prefix("pid=")) {
        Some(v) => match v.parse::<u32>() {
            Ok(pid) => pid,
            Err(_) => return text(400, "pid must be a process id\n"),
        },
        None => return text(400, "which process? /debug/memory_snapshot?pid=PID\n"),
    };
    let snapshots = snapshots.lock().unwrap_or_else(|e| e.into_inner());
    match snapshots.get(&pid) {
        Some(s) => Response {
            status: 200,
            content_type: "application/octet-stream",
            body: s.pickle(),
        },
        None => text(
            404,
            format!("no framework memory seen in traced process {pid}\n"),
        ),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

async fn serve_one(
    mut conn: TcpStream,
    shared: Arc<Shared>,
    sample_bytes: u64,
    hosts: Arc<AllowedHosts>,
) -> Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        let mut chunk = [0u8; 2048];
        loop {
            if buf.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
            if buf.len() > MAX_REQUEST {
                return Ok(false);
            }
            let n = conn.read(&mut chunk).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    let complete = matches!(read, Ok(Ok(true)));
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or("").split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let resp = if !complete {
        text(
            if buf.len() > MAX_REQUEST { 413 } else { 400 },
            "bad request\n",
        )
    } else if method != "GET" && method != "HEAD" {
        text(405, "only GET\n")
    } else if !hosts.allows(header(&head, "host")) {
        text(
            403,
            "unknown Host; name this agent by IP address, localhost, its host name or --allow-host\n",
        )
    } else {
        // Building a profile walks every process's heap: not on the I/O thread's hot path.
        let (shared, target) = (shared.clone(), target.to_string());
        let accept = header(&head, "accept").map(str::to_owned);
        tokio::task::spawn_blocking(move || {
            route(&shared, sample_bytes, &target, accept.as_deref())
        })
        .await?
    };
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        resp.status,
        reason(resp.status),
        resp.content_type,
        resp.body.len()
    );
    out.push_str("\r\n");
    conn.write_all(out.as_bytes()).await?;
    if method != "HEAD" {
        conn.write_all(&resp.body).await?;
    }
    conn.shutdown().await?;
    Ok(())
}

/// Whether an `accept` error means "out of descriptors or memory, try later".
fn is_resource_shortage(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Serves on `listener` until `stop` turns true.
pub fn serve(
    listener: StdListener,
    shared: Arc<Shared>,
    sample_bytes: u64,
    hosts: AllowedHosts,
    mut stop: watch::Receiver<bool>,
) -> std::thread::JoinHandle<()> {
    let hosts = Arc::new(hosts);
    std::thread::Builder::new()
        .name("agent-http".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    log::error(&format!("cannot start the HTTP server: {e}"));
                    return;
                }
            };
            rt.block_on(async move {
                let listener = match listener
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpListener::from_std(listener))
                {
                    Ok(l) => l,
                    Err(e) => {
                        log::error(&format!("cannot serve HTTP: {e}"));
                        return;
                    }
                };
                let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
                let mut short_of_fds_reported = false;
                loop {
                    // A free slot first, then a connection: beyond the limit, clients wait
                    // in the backlog instead of holding our descriptors.
                    let slot = tokio::select! {
                        slot = slots.clone().acquire_owned() => match slot {
                            Ok(s) => s,
                            Err(_) => break,
                        },
                        _ = stop.changed() => break,
                    };
                    tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((conn, _)) => {
                                let (shared, hosts) = (shared.clone(), hosts.clone());
                                tokio::spawn(async move {
                                    let _slot = slot;
                                    if let Err(e) = serve_one(conn, shared, sample_bytes, hosts).await {
                                        log::debug(&format!("HTTP request failed: {e:#}"));
                                    }
                                });
                            }
                            Err(e) if is_resource_shortage(&e) => {
                                if !short_of_fds_reported {
                                    short_of_fds_reported = true;
                                    log::warn(&format!(
                                        "HTTP: cannot accept connections ({e}); pausing {} ms \
                                         between tries",
                                        ACCEPT_BACKOFF.as_millis()
                                    ));
                                }
                                tokio::time::sleep(ACCEPT_BACKOFF).await;
                            }
                            Err(e) => log::debug(&format!("accept failed: {e}")),
                        },
                        _ = stop.changed() => break,
                    }
                }
            });
        })
        .expect("spawn the HTTP thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_a_rebound_page_sends_are_refused() {
        let hosts = AllowedHosts::new(&["Scrape.Example".into()]);
        for ok in [
            "127.0.0.1:9464",
            "10.0.0.7",
            "[::1]:9464",
            "localhost:9464",
            "LOCALHOST.",
            "scrape.example:80",
        ] {
            assert!(hosts.allows(Some(ok)), "{ok}");
        }
        for bad in [
            "evil.example:9464",
            "127.0.0.1.evil.example",
            "localhost.evil.example",
            "[::1",
            "::1",
            "",
        ] {
            assert!(!hosts.allows(Some(bad)), "{bad}");
        }
        assert!(hosts.allows(None), "HTTP/1.0 without Host");
        let head = "GET / HTTP/1.1\r\nhOsT:  a.example:1 \r\nX: y\r\n\r\n";
        assert_eq!(header(head, "host"), Some("a.example:1"));
    }
}

//! The agent's HTTP endpoints: a deliberately small HTTP/1.1 server on tokio (GET only, one
//! request per connection, bounded request size and time), on a thread of its own so scrapes
//! are answered while the session drains events. A full HTTP stack (hyper) would add a dozen
//! crates for four read-only endpoints.

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

/// Answers one request target (`/metrics`, `/debug/pprof/heap?pid=7`, ...).
pub fn route(shared: &Arc<Shared>, sample_bytes: u64, target: &str) -> Response {
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/metrics" => Response {
            status: 200,
            content_type: metrics::CONTENT_TYPE,
            body: metrics::render(shared).into_bytes(),
        },
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
        "/" => text(
            200,
            "memscope-bpf agent\n/metrics\n/ready\n/debug/pprof/heap[?pid=PID]\n",
        ),
        _ => text(404, "not found; see /\n"),
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Content Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

async fn serve_one(mut conn: TcpStream, shared: Arc<Shared>, sample_bytes: u64) -> Result<()> {
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
    } else {
        // Building a profile walks every process's heap: not on the I/O thread's hot path.
        let (shared, target) = (shared.clone(), target.to_string());
        tokio::task::spawn_blocking(move || route(&shared, sample_bytes, &target)).await?
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

/// Serves on `listener` until `stop` turns true.
pub fn serve(
    listener: StdListener,
    shared: Arc<Shared>,
    sample_bytes: u64,
    mut stop: watch::Receiver<bool>,
) -> std::thread::JoinHandle<()> {
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
                loop {
                    tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((conn, _)) => {
                                let shared = shared.clone();
                                tokio::spawn(async move {
                                    if let Err(e) = serve_one(conn, shared, sample_bytes).await {
                                        log::debug(&format!("HTTP request failed: {e:#}"));
                                    }
                                });
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

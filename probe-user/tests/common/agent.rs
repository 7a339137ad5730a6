//! A node agent started for a test, and plain HTTP against it (the tests that attack the
//! agent or soak it; tests/agent.rs keeps its own richer helper).

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use super::{Background, fixtures};

pub struct TestAgent {
    /// None once stopped.
    pub bg: Option<Background>,
    pub addr: String,
}

/// A free loopback address (bound and released).
pub fn free_addr() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("127.0.0.1:{port}")
}

/// One HTTP GET with the given `Host` header: (status, body).
pub fn get_as(addr: &str, host: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut all = Vec::new();
    s.read_to_end(&mut all).ok()?;
    let all = String::from_utf8_lossy(&all).into_owned();
    let (head, body) = all.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_owned()))
}

pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    get_as(addr, addr, path)
}

impl TestAgent {
    /// An agent on a free port probing the fixture libraries, with `extra` options.
    pub fn start(extra: &[&str]) -> TestAgent {
        let lib = fixtures().join("lib");
        let libs: Vec<String> = ["libascend_hal.so", "libms_tools_ext.so", "libascendcl.so"]
            .iter()
            .map(|l| lib.join(l).display().to_string())
            .collect();
        let mut args = Vec::new();
        for l in &libs {
            args.extend_from_slice(&["--lib", l]);
        }
        args.extend_from_slice(extra);
        Self::start_with_defaults(&args)
    }

    /// An agent on a free port with its defaults (no `--lib`), and `extra` options.
    pub fn start_with_defaults(extra: &[&str]) -> TestAgent {
        let addr = free_addr();
        let mut args = vec!["agent", "--listen", &addr, "--snapshot-ms", "200"];
        args.extend_from_slice(extra);
        let agent = TestAgent {
            bg: Some(Background::spawn(&args)),
            addr,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while !matches!(get(&agent.addr, "/ready"), Some((200, _))) {
            assert!(Instant::now() < deadline, "agent never became ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        agent
    }

    pub fn pid(&self) -> u32 {
        self.bg.as_ref().expect("running").child.id()
    }

    /// SIGTERM, then its exit code and stderr.
    pub fn stop(mut self) -> (Option<i32>, String) {
        let bg = self.bg.take().expect("running");
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(bg.child.id() as i32, libc::SIGTERM) };
        bg.finish()
    }

    /// Waits until /metrics says `pid` exited (its exit went through the whole session).
    pub fn wait_reported_exit(&self, pid: u32) {
        let needle = format!("memscope_process_exited{{pid=\"{pid}\"");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some((200, body)) = get(&self.addr, "/metrics")
                && body
                    .lines()
                    .any(|l| l.starts_with(&needle) && l.ends_with(" 1"))
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the agent never reported the exit of {pid}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A system-wide tracer must not outlive a failed test.
impl Drop for TestAgent {
    fn drop(&mut self) {
        if let Some(bg) = self.bg.take() {
            // SAFETY: plain kill(2) on our child.
            unsafe { libc::kill(bg.child.id() as i32, libc::SIGTERM) };
            let _ = bg.finish();
        }
    }
}

/// The samples of a text exposition: (name, labels, value) per `name{labels} value` line.
pub type Samples = Vec<(String, BTreeMap<String, String>, f64)>;

/// Parses `name{labels} value` lines (comments and blank lines skipped). Label values here
/// hold no `",`.
pub fn samples(text: &str) -> Samples {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let labels = labels
                .trim_end_matches('}')
                .split("\",")
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_string(), v.trim_matches('"').to_string())
                })
                .collect();
            (name.to_string(), labels, value.parse().unwrap())
        })
        .collect()
}

/// A per-process series' value, if the agent has one for `pid`.
pub fn of_pid(m: &Samples, name: &str, pid: u32) -> Option<f64> {
    m.iter()
        .find(|(n, l, _)| n == name && l.get("pid") == Some(&pid.to_string()))
        .map(|(_, _, v)| *v)
}

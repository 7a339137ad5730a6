//! What the node agent gives away and how it holds up when a local user or a web page leans on
//! it (issue 27; docs/security.md, "The node agent"): a `Host` check against DNS rebinding, a
//! bound on connections however many a client opens, an open-file limit raised at start, and
//! its port free for the next agent the moment it has exited.

mod common;

use std::{net::TcpStream, os::unix::process::CommandExt, process::Command, time::Duration};

use common::{agent::*, *};

/// Sockets a process holds (its other descriptors come and go with the traced processes of
/// a shared machine).
fn socket_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
        })
        .count()
}

/// (soft, hard) "Max open files" of a process.
fn open_file_limits(pid: u32) -> (String, String) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files");
    let v: Vec<&str> = line.split_whitespace().collect();
    (v[3].to_owned(), v[4].to_owned())
}

#[test]
fn agent_refuses_foreign_host_names_and_bounds_its_connections() {
    if !require_root("agent_refuses_foreign_host_names_and_bounds_its_connections") {
        return;
    }
    let _serial = serial();
    let agent = TestAgent::start(&["--allow-host", "scrape.example"]);
    let port = agent.addr.rsplit(':').next().unwrap().to_owned();

    // DNS rebinding: a page of evil.example, its name now resolving to this node.
    let (status, body) = get_as(&agent.addr, &format!("evil.example:{port}"), "/metrics").unwrap();
    assert_eq!(status, 403, "{body}");
    let (status, _) = get_as(&agent.addr, "evil.example", "/debug/pprof/heap").unwrap();
    assert_eq!(status, 403);
    // What Prometheus and pprof tools send is answered.
    for host in [
        agent.addr.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        format!("SCRAPE.example:{port}"),
    ] {
        let (status, _) = get_as(&agent.addr, &host, "/metrics").unwrap();
        assert_eq!(status, 200, "Host: {host}");
    }

    // A local user opens connections and sends nothing: the agent's descriptors stay bounded.
    let before = socket_count(agent.pid());
    let idle: Vec<TcpStream> = (0..120)
        .filter_map(|_| TcpStream::connect(&agent.addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = socket_count(agent.pid());
    assert!(
        during <= before + 32,
        "{} idle connections took {} sockets of the agent (at most 32 at once)",
        idle.len(),
        during - before
    );
    drop(idle);
    // Once they go, it answers again.
    let (status, _) = get(&agent.addr, "/metrics").expect("/metrics after the flood");
    assert_eq!(status, 200);
    let (code, stderr) = agent.stop();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn agent_port_is_free_the_moment_it_exits() {
    if !require_root("agent_port_is_free_the_moment_it_exits") {
        return;
    }
    let _serial = serial();
    let agent = TestAgent::start(&[]);
    let addr = agent.addr.clone();
    let (code, stderr) = agent.stop();
    assert_eq!(code, Some(0), "{stderr}");
    // `systemctl restart`: the next agent binds at once. The detacher that outlives the agent
    // (it unregisters the probes) must not hold the listening socket.
    let bound = std::net::TcpListener::bind(&addr);
    assert!(bound.is_ok(), "{addr} still taken: {bound:?}");
}

/// An agent started as systemd starts it: a soft open-file limit (1,024) below the hard one.
#[test]
fn agent_raises_a_low_soft_open_file_limit() {
    if !require_root("agent_raises_a_low_soft_open_file_limit") {
        return;
    }
    let _serial = serial();
    let addr = free_addr();
    let mut ours = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut ours) },
        0
    );
    let hard = ours.rlim_max;
    let soft = hard.min(1024) / 2;
    let mut cmd = Command::new(TRACER);
    cmd.args(["agent", "--listen", &addr, "--stack-depth", "0"]);
    // SAFETY: setrlimit is async-signal-safe; only our child's limit changes.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the agent");
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !matches!(get(&addr, "/ready"), Some((200, _))) {
        if std::time::Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!("agent never became ready");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let limits = open_file_limits(child.id());
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    let hard_text = if hard == libc::RLIM_INFINITY {
        "unlimited".to_owned()
    } else {
        hard.to_string()
    };
    assert_eq!(limits, (hard_text.clone(), hard_text), "raised from {soft}");
}

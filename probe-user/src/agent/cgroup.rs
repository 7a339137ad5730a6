//! Which container (and Kubernetes pod) a process runs in, from its cgroup path
//! (`/proc/PID/cgroup`), as two bounded labels: `container` and `pod_uid`.
//!
//! The runtimes name the cgroups they make (shapes in the tests below, each with where it
//! comes from):
//!
//! * containerd's CRI plugin `cri-containerd-<id>.scope`, CRI-O `crio-<id>.scope`, Docker
//!   `docker-<id>.scope`, Podman `libpod-<id>.scope` under the systemd cgroup driver;
//!   `/docker/<id>` and `/kubepods/<qos>/pod<uid>/<id>` under the cgroupfs driver:
//!   `container` is the id's first 12 hex digits (what `docker ps` and `crictl ps` show);
//! * the kubelet's pod cgroups, `kubepods-<qos>-pod<uid with _>.slice` (systemd driver) or
//!   `pod<uid>` (cgroupfs): `pod_uid` is the pod's `metadata.uid`, with its dashes back;
//! * any other systemd unit (`nginx.service`, `session-3.scope`): `container` is the unit's
//!   name, the innermost `.service` or `.scope` (a slice alone names no container).
//!
//! A path may start with `/..` components where the agent runs in a cgroup namespace of its
//! own (a pod without `hostCgroupns`); only the names matter here. The cgroup v2 line
//! (`0::`) is read first, then the v1 hierarchies (a hybrid host puts Docker's containers in
//! the v1 controllers only).
//!
//! The labels are bounded by the processes: one (`container`, `pod_uid`) per pid, read once
//! when the agent picks a process up, so they add no series to `/metrics`.

/// A process's place in the cgroup tree, as labels; empty strings for "none".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Container {
    /// A runtime's container id (12 hex digits) or a systemd unit's name.
    pub id: String,
    /// The Kubernetes pod's UID (`metadata.uid`).
    pub pod_uid: String,
}

impl Container {
    /// The labels with a value, in the order `/metrics` and the profile show them.
    pub fn labels(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            ("container", self.id.as_str()),
            ("pod_uid", self.pod_uid.as_str()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
    }
}

/// Hex digits a runtime's container id has; the label keeps [`SHORT_ID`] of them.
const FULL_ID: usize = 64;
const SHORT_ID: usize = 12;

/// `/proc/PID/cgroup` read and parsed; the default (no labels) once the process is gone.
pub fn of_process(pid: u32) -> Container {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|text| parse_proc_cgroup(&text))
        .unwrap_or_default()
}

/// The container of a `/proc/PID/cgroup` text: the v2 line's path first, then each v1
/// hierarchy's; the first that names a container or pod wins, else the v2 path's unit.
pub fn parse_proc_cgroup(text: &str) -> Container {
    let mut paths: Vec<&str> = Vec::new();
    let mut v1: Vec<&str> = Vec::new();
    for line in text.lines() {
        // hierarchy-ID:controller-list:cgroup-path (the path may hold ':').
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(_), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" {
            paths.push(path);
        } else {
            v1.push(path);
        }
    }
    paths.extend(v1);
    let parsed: Vec<Container> = paths.iter().map(|p| parse_path(p)).collect();
    let runtime = parsed
        .iter()
        .find(|c| !c.pod_uid.is_empty() || is_id(&c.id));
    runtime
        .or_else(|| parsed.iter().find(|c| !c.id.is_empty()))
        .cloned()
        .unwrap_or_default()
}

/// Whether a `container` value is a runtime's short id (not a unit's name).
fn is_id(s: &str) -> bool {
    s.len() == SHORT_ID && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A full 64-hex-digit container id, shortened; None for anything else.
fn short_id(s: &str) -> Option<String> {
    (s.len() == FULL_ID && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| s[..SHORT_ID].to_ascii_lowercase())
}

/// A pod UID as a kubelet cgroup writes it (`pod<uid>`, dashes as `_` under systemd), with
/// its dashes back; None when it is not 36 characters of hex and dashes.
fn pod_uid(s: &str) -> Option<String> {
    let uid = s.replace('_', "-");
    let ok = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    ok.then(|| uid.to_ascii_lowercase())
}

/// The container of one cgroup path.
pub fn parse_path(path: &str) -> Container {
    let mut c = Container::default();
    let mut in_kubepods = false;
    let mut unit = None;
    // `:` too: containerd without the systemd driver under a systemd-style parent writes
    // `<parent>.slice:cri-containerd:<id>`.
    for name in path
        .split(['/', ':'])
        .filter(|n| !n.is_empty() && *n != "..")
    {
        if name == "kubepods" || name.starts_with("kubepods.") || name.starts_with("kubepods-") {
            in_kubepods = true;
        }
        // systemd driver: kubepods-pod<uid>.slice, kubepods-<qos>-pod<uid>.slice.
        if let Some(slice) = name.strip_suffix(".slice")
            && slice.starts_with("kubepods")
            && let Some((_, uid)) = slice.rsplit_once("-pod")
            && let Some(uid) = pod_uid(uid)
        {
            c.pod_uid = uid;
            continue;
        }
        // cgroupfs driver: /kubepods[/<qos>]/pod<uid>/<id>.
        if in_kubepods && let Some(uid) = name.strip_prefix("pod").and_then(pod_uid) {
            c.pod_uid = uid;
            continue;
        }
        // <runtime>-<id>.scope (systemd driver), crio-<id> (cgroupfs driver); a runtime's
        // helper (`crio-conmon-<id>`, `libpod-conmon-<id>`) is not the container.
        let bare = name.strip_suffix(".scope").unwrap_or(name);
        let id = match bare.rsplit_once('-') {
            Some((helper, _)) if helper.ends_with("conmon") => None,
            Some((_, id)) => short_id(id),
            // /docker/<id>, /kubepods/.../pod<uid>/<id>, slice:cri-containerd:<id>.
            None => short_id(bare),
        };
        if let Some(id) = id {
            c.id = id;
            unit = None;
            continue;
        }
        if name.ends_with(".service") || name.ends_with(".scope") {
            unit = Some(name);
        }
    }
    // In a pod, a unit that is no container is a runtime's helper: the pod says it all.
    if c.id.is_empty()
        && c.pod_uid.is_empty()
        && let Some(unit) = unit
    {
        c.id = unit.to_string();
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "7f2ba1c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f";
    const SHORT: &str = "7f2ba1c3d4e5";
    const UID: &str = "0c4a8f5e-1b2d-4e6f-9a0b-1c2d3e4f5a6b";

    fn with_pod(path: &str) -> Container {
        parse_path(path)
    }

    fn pod(id: &str) -> Container {
        Container {
            id: id.into(),
            pod_uid: UID.into(),
        }
    }

    fn plain(id: &str) -> Container {
        Container {
            id: id.into(),
            pod_uid: String::new(),
        }
    }

    /// The kubelet's systemd cgroup driver: `kubepods[-<qos>]-pod<uid with _>.slice` (the
    /// kubelet's `pkg/kubelet/cm/cgroup_manager_linux.go`: `ToSystemd` escapes `-` as `_`;
    /// `pod_container_manager_linux.go`: `podCgroupNamePrefix = "pod"`), holding the
    /// runtime's scope.
    #[test]
    fn kubernetes_with_the_systemd_driver() {
        let uid_ = UID.replace('-', "_");
        // containerd's CRI plugin: `cri-containerd-<id>.scope` (its systemd cgroup prefix;
        // falcosecurity/libs `userspace/libsinsp/cri.cpp`, `CRI_CGROUP_LAYOUT`).
        assert_eq!(
            with_pod(&format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/cri-containerd-{ID}.scope"
            )),
            pod(SHORT)
        );
        // CRI-O: `crio-<id>.scope` (cri-o `internal/config/cgmgr`, `CrioPrefix = "crio"`);
        // guaranteed pods have no QoS slice.
        assert_eq!(
            with_pod(&format!(
                "/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope"
            )),
            pod(SHORT)
        );
        assert_eq!(
            with_pod(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/crio-{ID}.scope"
            )),
            pod(SHORT)
        );
        // CRI-O's conmon sits beside the container: it names the pod, not the container.
        assert_eq!(
            with_pod(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/crio-conmon-{ID}.scope"
            )),
            pod("")
        );
        // containerd without `SystemdCgroup = true` under the kubelet's systemd parent, and
        // CRI-O with its cgroupfs manager (falcosecurity/libs, `userspace/libsinsp/cri.cpp`,
        // `CRI_CGROUP_LAYOUT`: the shapes container tools meet in the wild).
        assert_eq!(
            with_pod(&format!(
                "/kubepods-besteffort-pod{uid_}.slice:cri-containerd:{ID}"
            )),
            pod(SHORT)
        );
        assert_eq!(
            with_pod(&format!("/kubepods/besteffort/pod{UID}/crio-{ID}")),
            pod(SHORT)
        );
        // The pod's own cgroup (no container yet).
        assert_eq!(
            with_pod(&format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice"
            )),
            pod("")
        );
    }

    /// The kubelet's cgroupfs driver: `/kubepods/<qos>/pod<uid>/<id>`, the uid with its dashes
    /// (the kubelet's `pod_container_manager_linux.go`, `GetPodContainerName`).
    #[test]
    fn kubernetes_with_the_cgroupfs_driver() {
        assert_eq!(
            with_pod(&format!("/kubepods/besteffort/pod{UID}/{ID}")),
            pod(SHORT)
        );
        assert_eq!(with_pod(&format!("/kubepods/pod{UID}/{ID}")), pod(SHORT));
        assert_eq!(with_pod(&format!("/kubepods/burstable/pod{UID}")), pod(""));
    }

    /// Docker: `docker-<id>.scope` under `system.slice` (systemd driver) or `/docker/<id>`
    /// (cgroupfs driver; Docker docs, "Runtime metrics", "Find the cgroup for a given
    /// container"); Podman: `libpod-<id>.scope` under `machine.slice`.
    #[test]
    fn docker_and_podman() {
        assert_eq!(
            parse_path(&format!("/system.slice/docker-{ID}.scope")),
            plain(SHORT)
        );
        assert_eq!(parse_path(&format!("/docker/{ID}")), plain(SHORT));
        assert_eq!(
            parse_path(&format!("/machine.slice/libpod-{ID}.scope/container")),
            plain(SHORT)
        );
        assert_eq!(
            parse_path(&format!("/machine.slice/libpod-conmon-{ID}.scope")),
            plain(
                "libpod-conmon-7f2ba1c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f.scope"
            )
        );
    }

    /// Plain systemd units (systemd.unit(5), "The cgroup tree"): services, session scopes,
    /// user services; slices alone and the root name nothing.
    #[test]
    fn systemd_units() {
        assert_eq!(
            parse_path("/system.slice/train-job.service"),
            plain("train-job.service")
        );
        assert_eq!(
            parse_path("/user.slice/user-1000.slice/session-3.scope"),
            plain("session-3.scope")
        );
        assert_eq!(
            parse_path(
                "/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-term-42.scope"
            ),
            plain("app-gnome-term-42.scope")
        );
        assert_eq!(parse_path("/init.scope"), plain("init.scope"));
        assert_eq!(parse_path("/user.slice"), plain(""));
        assert_eq!(parse_path("/"), plain(""));
        // A scope whose last word is not a container id is a unit.
        assert_eq!(
            parse_path("/system.slice/run-r1b2c3.scope"),
            plain("run-r1b2c3.scope")
        );
    }

    /// Seen from a cgroup namespace of the agent's own, another pod's path climbs out first
    /// (cgroup_namespaces(7)).
    #[test]
    fn paths_from_inside_a_cgroup_namespace() {
        let uid_ = UID.replace('-', "_");
        assert_eq!(
            with_pod(&format!(
                "/../../kubepods-besteffort-pod{uid_}.slice/cri-containerd-{ID}.scope"
            )),
            pod(SHORT)
        );
    }

    /// Whole `/proc/PID/cgroup` files (cgroups(7), "/proc/[pid]/cgroup"): a pure v2 host, and
    /// a hybrid one where Docker's cgroupfs driver uses the v1 hierarchies and v2 shows `/`.
    #[test]
    fn whole_proc_files() {
        let uid_ = UID.replace('-', "_");
        let v2 = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/cri-containerd-{ID}.scope\n"
        );
        assert_eq!(parse_proc_cgroup(&v2), pod(SHORT));
        let hybrid = format!(
            "12:memory:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/\n"
        );
        assert_eq!(parse_proc_cgroup(&hybrid), plain(SHORT));
        // A unit on v2 beats nothing on v1; a container id on v1 beats a unit on v2.
        let unit = "1:name=systemd:/system.slice/a.service\n0::/system.slice/a.service\n";
        assert_eq!(parse_proc_cgroup(unit), plain("a.service"));
        let both = format!("4:memory:/docker/{ID}\n0::/system.slice/a.service\n");
        assert_eq!(parse_proc_cgroup(&both), plain(SHORT));
        assert_eq!(parse_proc_cgroup(""), Container::default());
        assert_eq!(parse_proc_cgroup("garbage"), Container::default());
    }

    #[test]
    fn labels_leave_out_empty_values() {
        let c = pod(SHORT);
        let l: Vec<_> = c.labels().collect();
        assert_eq!(l, [("container", SHORT), ("pod_uid", UID)]);
        assert_eq!(Container::default().labels().count(), 0);
    }
}

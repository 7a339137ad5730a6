//! The Grafana dashboard of deploy/kubernetes, read as data (tests/deploy.rs checks it against
//! Grafana's schema and promtool; tests/agent_fleet.rs against a live agent's /metrics).

use super::repo_root;

/// Every panel's (title, PromQL), Grafana's variables given values as Grafana would
/// (`$__rate_interval` a duration, a multi-value `$var` the regex `.*`).
pub fn dashboard_queries() -> Vec<(String, String)> {
    let path = repo_root().join("deploy/kubernetes/grafana-dashboard.json");
    let text = std::fs::read_to_string(path).unwrap();
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            let promql = expr
                .replace("$__rate_interval", "1m")
                .replace("$node", ".*")
                .replace("$pod_uid", ".*");
            assert!(!promql.contains('$'), "an unknown variable in {expr}");
            out.push((p["title"].as_str().unwrap().to_string(), promql));
        }
    }
    out
}

/// The `memscope_*` metric names a query reads.
pub fn metric_names(promql: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = promql;
    while let Some(at) = rest.find("memscope_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

/// The label names a query groups by (`by (a, b)`).
pub fn grouping_labels(promql: &str) -> Vec<String> {
    let mut labels = Vec::new();
    let mut rest = promql;
    while let Some(at) = rest.find("by (") {
        rest = &rest[at + 4..];
        let end = rest.find(')').expect("a closed by (...)");
        labels.extend(rest[..end].split(',').map(|l| l.trim().to_string()));
        rest = &rest[end..];
    }
    labels
}

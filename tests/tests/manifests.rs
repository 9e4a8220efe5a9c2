//! deploy/ as a platform team running the Prometheus Operator applies it:
//! the Kubernetes objects (the DaemonSet, its Service, the ServiceMonitor and
//! the PrometheusRule) validated strictly and offline against the real
//! schemas, the PrometheusRule held to the plain rule file, the objects held
//! to each other, and the Grafana dashboard held to the metrics stall
//! exports. No root, no eBPF.
//!
//! The schemas are Python packages that `cargo xtask test` installs and
//! names in $STALL_SCHEMAS_PATH (xtask/src/setup.rs, `SCHEMA_PACKAGES`);
//! tests/manifests/validate.py runs them. Without them the schema tests
//! fail: a skipped check would pass anything.
use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use serde_json::Value;
use stall_tests::procs::run_with_timeout;
use stall_tests::scratch::Scratch;

/// The objects `kubectl apply` takes, in deploy/.
const KUBERNETES_OBJECTS: [&str; 4] =
    ["daemonset.yaml", "service.yaml", "servicemonitor.yaml", "prometheusrule.yaml"];
/// The interpreter `cargo xtask test` installs the schema packages for.
const PYTHON: &str = "/usr/bin/python3";
/// The metrics, as stall registers them (compiled in: the VMs carry deploy/
/// and tests/, not the agent's source).
const METRICS_RS: &str = include_str!("../../stall-agent/src/daemon/metrics.rs");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn deploy(name: &str) -> PathBuf {
    root().join("deploy").join(name)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A YAML file (one document) as JSON values.
fn yaml(path: &Path) -> Value {
    serde_yaml_ng::from_str(&read(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard() -> Value {
    let path = deploy("grafana-dashboard.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The schema packages: $STALL_SCHEMAS_PATH, which `cargo xtask test` sets
/// after installing them. Missing is a failure, never a skip.
fn schemas_path() -> PathBuf {
    let dir = std::env::var_os("STALL_SCHEMAS_PATH").map(PathBuf::from).unwrap_or_else(|| {
        panic!(
            "STALL_SCHEMAS_PATH is not set: run the tests with `cargo xtask test`, which installs the \
             Kubernetes and Prometheus Operator schemas (xtask/src/setup.rs, SCHEMA_PACKAGES) and sets it"
        )
    });
    assert!(
        dir.join("kubernetes_validate/__init__.py").exists()
            && dir.join("cloudcoil/models/prometheus_operator/v1.py").exists(),
        "no schema packages in {} (STALL_SCHEMAS_PATH): run `cargo xtask test`, which installs them",
        dir.display()
    );
    dir
}

/// tests/manifests/validate.py on `files`: whether all passed, and its
/// report (one `ok PATH: ...` or `FAIL PATH: ...` line per document and
/// schema).
fn validate(files: &[PathBuf]) -> (bool, String) {
    let schemas = schemas_path();
    let mut cmd = Command::new(PYTHON);
    cmd.arg("-sB")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/validate.py"))
        .args(files)
        .env("PYTHONPATH", &schemas);
    let out = run_with_timeout(cmd, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // 0 and 1 are verdicts; anything else (a traceback) is a broken validator.
    assert!(matches!(out.status.code(), Some(0 | 1)), "validate.py: {}\n{stdout}{stderr}", out.status);
    (out.status.success(), stdout)
}

/// The report's lines about `file`.
fn lines_of<'a>(report: &'a str, file: &Path) -> Vec<&'a str> {
    let tag = format!(" {}: ", file.display());
    report.lines().filter(|l| l.contains(&tag)).collect()
}

#[test]
fn deploy_objects_pass_strict_schema_validation() {
    let files: Vec<PathBuf> = KUBERNETES_OBJECTS.iter().map(|f| deploy(f)).collect();
    let (passed, report) = validate(&files);
    assert!(passed, "deploy/ fails schema validation:\n{report}");
    for f in &files {
        let lines = lines_of(&report, f);
        assert!(
            !lines.is_empty() && lines.iter().all(|l| l.starts_with("ok ")),
            "{}:\n{report}",
            f.display()
        );
    }
    // Kubernetes' own kinds on two versions, the operator's on its CRDs.
    for (file, schema) in [
        ("daemonset.yaml", "DaemonSet/stall (Kubernetes 1.28 strict)"),
        ("daemonset.yaml", "DaemonSet/stall (Kubernetes 1.37 strict)"),
        ("service.yaml", "Service/stall (Kubernetes 1.37 strict)"),
        ("servicemonitor.yaml", "ServiceMonitor/stall (prometheus-operator CRD ServiceMonitor)"),
        ("prometheusrule.yaml", "PrometheusRule/stall (prometheus-operator CRD PrometheusRule)"),
    ] {
        let line = format!("ok {}: {schema}", deploy(file).display());
        assert!(report.lines().any(|l| l == line), "no `{line}` in:\n{report}");
    }
}

/// The validation is strict: a misspelled field, a string for a number, a
/// missing required field, a value outside an enum or pattern, and a kind
/// without a schema each fail, in Kubernetes' kinds and the operator's.
#[test]
fn schema_validation_rejects_misspelled_fields_wrong_types_and_missing_ones() {
    // (copy, from, text in it, replaced by, what the failure says)
    let cases: [(&str, &str, &str, &str, &str); 11] = [
        ("ds-hostpid", "daemonset.yaml", "hostPID: true", "hostPid: true", "'hostPid' was unexpected"),
        (
            "ds-port-type",
            "daemonset.yaml",
            "containerPort: 9464",
            "containerPort: \"9464\"",
            "'9464' is not of type 'integer'",
        ),
        ("svc-no-port", "service.yaml", "port: 9464, ", "", "'port' is a required property"),
        ("svc-no-schema", "service.yaml", "apiVersion: v1", "apiVersion: v2", "Couldn't find schema"),
        (
            "sm-basicauth",
            "servicemonitor.yaml",
            "basicAuth:",
            "basicauth:",
            "basicauth: Extra inputs are not permitted",
        ),
        // The models' Python attribute names are no way around the CRD's.
        (
            "sm-snake-case",
            "servicemonitor.yaml",
            "targetLabel: node",
            "target_label: node",
            "target_label: Extra inputs are not permitted",
        ),
        ("sm-scheme", "servicemonitor.yaml", "scheme: https", "scheme: tls", "scheme: Input should be"),
        (
            "sm-interval",
            "servicemonitor.yaml",
            "interval: 15s",
            "interval: 15",
            "interval: Input should be a valid string",
        ),
        (
            "sm-kind",
            "servicemonitor.yaml",
            "kind: ServiceMonitor\n",
            "kind: ServiceMonitors\n",
            "no such kind",
        ),
        (
            "pr-expr",
            "prometheusrule.yaml",
            "expr: stall_verdict{kind=\"hang\"}",
            "exp: stall_verdict{kind=\"hang\"}",
            "expr: Field required",
        ),
        ("pr-for", "prometheusrule.yaml", "for: 2m", "for: 2 minutes", "for: String should match pattern"),
    ];
    let dir = Scratch::new("manifests");
    let mut files = Vec::new();
    for (copy, from, text, by, _) in cases {
        let original = read(&deploy(from));
        assert_eq!(original.matches(text).count(), 1, "`{text}` should be in deploy/{from} once");
        let path = dir.path(&format!("{copy}.yaml"));
        std::fs::write(&path, original.replace(text, by)).unwrap();
        files.push(path);
    }
    let (passed, report) = validate(&files);
    assert!(!passed, "mutated manifests passed:\n{report}");
    for ((copy, _, _, _, why), path) in cases.iter().zip(&files) {
        let lines = lines_of(&report, path);
        assert!(
            !lines.is_empty() && lines.iter().all(|l| l.starts_with("FAIL ")),
            "{copy} passed some schema:\n{report}"
        );
        assert!(lines.iter().any(|l| l.contains(why)), "{copy}: no `{why}` in:\n{report}");
    }
}

/// deploy/prometheusrule.yaml carries exactly the groups of
/// deploy/stall-alerts.yml (which promtool tests), so the two never drift.
#[test]
fn prometheus_rule_holds_exactly_the_alert_file_groups() {
    let rule = yaml(&deploy("prometheusrule.yaml"));
    let alerts = yaml(&deploy("stall-alerts.yml"));
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    let (got, want) = (&rule["spec"]["groups"], &alerts["groups"]);
    assert!(want.as_array().is_some_and(|g| !g.is_empty()), "no groups in deploy/stall-alerts.yml");
    if got != want {
        let rules = |groups: &Value| -> Vec<Value> {
            let groups = groups.as_array().into_iter().flatten();
            groups.flat_map(|g| g["rules"].as_array().into_iter().flatten().cloned()).collect()
        };
        let differ: Vec<String> = (rules(want).into_iter())
            .filter(|w| !rules(got).contains(w))
            .map(|r| r["alert"].as_str().or(r["record"].as_str()).unwrap_or("?").to_string())
            .collect();
        panic!(
            "deploy/prometheusrule.yaml's spec.groups are not deploy/stall-alerts.yml's groups (rules that \
             differ or are missing: {differ:?}; extra or reordered ones otherwise): copy them over with the \
             command at the top of prometheusrule.yaml"
        );
    }
}

/// The Service selects the DaemonSet's pods and names its port; the
/// ServiceMonitor selects the Service, scrapes that port over HTTPS with
/// basic auth, and names each target by its node.
#[test]
fn service_and_service_monitor_reach_the_daemonset() {
    let ds = yaml(&deploy("daemonset.yaml"));
    let svc = yaml(&deploy("service.yaml"));
    let sm = yaml(&deploy("servicemonitor.yaml"));
    for (what, obj) in [("DaemonSet", &ds), ("Service", &svc), ("ServiceMonitor", &sm)] {
        assert_eq!(obj["metadata"]["namespace"], "monitoring", "{what}");
        assert_eq!(obj["metadata"]["name"], "stall", "{what}");
    }
    let template = &ds["spec"]["template"];
    let subset = |want: &Value, have: &Value| {
        want.as_object().is_some_and(|w| !w.is_empty() && w.iter().all(|(k, v)| have.get(k) == Some(v)))
    };
    assert!(
        subset(&svc["spec"]["selector"], &template["metadata"]["labels"]),
        "the Service's selector misses the DaemonSet's pods"
    );
    assert!(
        template["metadata"]["annotations"]
            .as_object()
            .is_none_or(|a| !a.keys().any(|k| k.starts_with("prometheus.io/"))),
        "prometheus.io/* annotations are back on the DaemonSet's pods (see the comment there)"
    );
    let rolling = &ds["spec"]["updateStrategy"]["rollingUpdate"];
    assert_eq!(rolling["maxSurge"], 0, "a surge would put two targets with one `instance` on a node");
    let container = &template["spec"]["containers"][0];
    let port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(args.contains(&"--listen=0.0.0.0:9464") && port["containerPort"] == 9464, "{args:?} {port}");
    assert!(
        args.iter().any(|a| a.starts_with("--web-config=")),
        "the ServiceMonitor scrapes HTTPS: {args:?}"
    );
    // The kubelet probes the health port, in plain HTTP: it never waits
    // behind the TLS handshakes and password checks of the metrics port.
    let health = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "health")
        .expect("a port named health");
    assert!(
        args.iter().any(|a| *a == format!("--health-listen=0.0.0.0:{}", health["containerPort"])),
        "{args:?} {health}"
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(
            (&get["path"], &get["port"], &get["scheme"]),
            (&"/healthz".into(), &"health".into(), &"HTTP".into()),
            "{probe}"
        );
    }
    let svc_port = &svc["spec"]["ports"][0];
    assert_eq!(svc_port["name"], "metrics");
    assert_eq!(svc_port["port"], 9464);
    assert_eq!(svc_port["targetPort"], "metrics");

    assert!(
        subset(&sm["spec"]["selector"]["matchLabels"], &svc["metadata"]["labels"]),
        "the ServiceMonitor misses the Service"
    );
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"], serde_json::json!(["monitoring"]));
    let endpoints = sm["spec"]["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1);
    let ep = &endpoints[0];
    assert_eq!(ep["port"], "metrics");
    assert_eq!(ep["scheme"], "https");
    assert_eq!(ep["interval"], "15s");
    for key in ["username", "password"] {
        assert_eq!(ep["basicAuth"][key], serde_json::json!({"name": "stall-scrape-auth", "key": key}));
    }
    assert_eq!(ep["tlsConfig"]["ca"]["secret"]["name"], "stall-scrape-auth");
    assert_eq!(ep["tlsConfig"]["serverName"], "stall.monitoring.svc");
    let relabelings = ep["relabelings"].as_array().unwrap();
    for target in ["node", "instance"] {
        assert!(
            relabelings.iter().any(|r| r["targetLabel"] == target
                && r["sourceLabels"] == serde_json::json!(["__meta_kubernetes_pod_node_name"])
                && r.get("action").is_none_or(|a| a == "replace")),
            "no relabeling sets `{target}` to the node's name"
        );
    }
    // The operator's own target labels would rename stall's job labels.
    let dropped = relabelings.iter().find(|r| r["action"] == "labeldrop").expect("a labeldrop relabeling");
    let regex = dropped["regex"].as_str().unwrap();
    let mut names: Vec<&str> = regex.split('|').collect();
    names.sort_unstable();
    assert_eq!(names, ["container", "namespace", "pod"], "{regex}");
}

/// The names under which stall exports its metrics, from the registrations
/// in stall-agent/src/daemon/metrics.rs: `field: Type = "name" [in unit],
/// "help";`, registered with the `stall` prefix and the unit as a suffix,
/// and a counter with `_total` in the exposition (what Prometheus stores).
fn exported_metrics() -> BTreeSet<String> {
    let start = METRICS_RS.find("\nmetrics! {").expect("the metrics! { ... } registrations in metrics.rs");
    let body = &METRICS_RS[start..];
    let body = &body[..body.find("\n}\n").expect("the end of metrics! { ... }")];
    let mut names = BTreeSet::new();
    for line in body.lines().map(str::trim) {
        let line = line.strip_prefix("pub ").unwrap_or(line);
        let Some((field, rest)) = line.split_once(": ") else { continue };
        let Some((ty, rest)) = rest.split_once(" = \"") else { continue };
        if field.is_empty() || !field.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let (name, rest) = rest.split_once('"').expect("a quoted metric name");
        let mut full = format!("stall_{name}");
        if let Some(unit) = rest.trim_start().strip_prefix("in ") {
            let unit = unit.split(',').next().unwrap().trim();
            let suffix = match unit.strip_prefix("Unit::Other(\"") {
                Some(other) => other.split('"').next().unwrap().to_string(),
                None => unit.strip_prefix("Unit::").unwrap_or_else(|| panic!("unit `{unit}`")).to_lowercase(),
            };
            full = format!("{full}_{suffix}");
        }
        if ty.contains("Counter") {
            full.push_str("_total");
        }
        names.insert(full);
    }
    // The parser read the registrations it should (docs/DAEMON.md's names).
    for known in [
        "stall_read_bytes_total",
        "stall_verdict",
        "stall_gpu_power_watts",
        "stall_last_progress_timestamp_seconds",
    ] {
        assert!(names.contains(known), "{known} not among {names:?}: has metrics.rs's macro changed?");
    }
    assert!(names.len() >= 25, "{names:?}");
    names
}

/// The identifiers of a PromQL expression outside its string literals:
/// metric names among them.
fn identifiers(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = expr.chars().peekable();
    let mut word = String::new();
    while let Some(c) = chars.next() {
        if matches!(c, '"' | '\'' | '`') {
            // A string literal (label values, label_replace's arguments).
            while let Some(d) = chars.next() {
                if d == '\\' {
                    chars.next();
                } else if d == c {
                    break;
                }
            }
        } else if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            out.push(std::mem::take(&mut word));
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Every string in a JSON value.
fn strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|v| strings(v, out)),
        Value::Object(o) => o.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

/// The dashboard's queries: each panel's targets' `expr`, and the variables'.
fn dashboard_queries(d: &Value) -> Vec<String> {
    let mut q: Vec<String> = d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    for v in d["templating"]["list"].as_array().unwrap() {
        if v["type"] == "query" {
            q.extend(v["query"].as_str().map(str::to_string));
        }
    }
    q
}

/// Every metric the dashboard, the rules and the ServiceMonitor name is one
/// stall exports (dcgm-exporter's `DCGM_` series aside).
#[test]
fn dashboard_and_rules_name_only_metrics_stall_exports() {
    let exported = exported_metrics();
    let mut sources: Vec<(String, String)> = Vec::new();
    for q in dashboard_queries(&dashboard()) {
        sources.push(("grafana-dashboard.json".into(), q));
    }
    for file in ["stall-alerts.yml", "prometheusrule.yaml"] {
        let doc = yaml(&deploy(file));
        let groups = if file == "stall-alerts.yml" { &doc["groups"] } else { &doc["spec"]["groups"] };
        for rule in groups.as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()) {
            sources.push((file.into(), rule["expr"].as_str().expect("a rule's expr").to_string()));
        }
    }
    let mut sm = Vec::new();
    strings(&yaml(&deploy("servicemonitor.yaml"))["spec"], &mut sm);
    sources.extend(sm.into_iter().map(|s| ("servicemonitor.yaml".to_string(), s)));

    let mut used = BTreeSet::new();
    let mut unknown = Vec::new();
    for (file, text) in &sources {
        for id in identifiers(text) {
            if id.starts_with("stall_") {
                if !exported.contains(&id) {
                    unknown.push(format!("{id} (deploy/{file})"));
                }
                used.insert(id);
            } else if id.starts_with("DCGM_") {
                used.insert(id);
            }
        }
    }
    assert!(unknown.is_empty(), "not exported by stall (metrics.rs): {unknown:?}; exported: {exported:?}");
    for want in [
        "stall_verdict",
        "stall_job_gpu_utilization_ratio",
        "stall_gpu_utilization_ratio",
        "stall_last_progress_timestamp_seconds",
        "stall_rank_verdict",
        "stall_rank_peer_wait_ratio",
        "stall_nvml_up",
        "DCGM_FI_DEV_GPU_UTIL",
    ] {
        assert!(used.contains(want), "{want} is used nowhere in deploy/: {used:?}");
    }
}

/// The dashboard: Grafana JSON (schema 36 or later) on the `${datasource}`
/// variable everywhere, with the node, namespace and pod variables, and
/// every query valid PromQL (promtool parses them as recording rules).
#[test]
fn dashboard_is_on_the_datasource_variable_and_its_queries_parse() {
    let d = dashboard();
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion {}", d["schemaVersion"]);
    assert!(d["uid"].as_str().is_some_and(|u| !u.is_empty()) && d["title"].is_string());
    let vars = d["templating"]["list"].as_array().unwrap();
    let var =
        |name: &str| vars.iter().find(|v| v["name"] == name).unwrap_or_else(|| panic!("no ${name} variable"));
    assert_eq!(var("datasource")["type"], "datasource");
    assert_eq!(var("datasource")["query"], "prometheus");
    for name in ["node", "namespace", "pod"] {
        assert_eq!(var(name)["type"], "query", "{name}");
        assert_eq!(var(name)["datasource"]["uid"], "${datasource}", "{name}");
    }
    let on_variable = |ds: &Value| ds["uid"] == "${datasource}" && ds["type"] == "prometheus";
    let panels = d["panels"].as_array().unwrap();
    assert!(panels.len() >= 6, "{} panels", panels.len());
    let mut ids = BTreeSet::new();
    for p in panels {
        let title = p["title"].as_str().unwrap_or("?");
        assert!(ids.insert(p["id"].as_u64().expect("a panel id")), "panel id {} twice", p["id"]);
        assert!(on_variable(&p["datasource"]), "panel `{title}`: datasource {}", p["datasource"]);
        let targets = p["targets"].as_array().unwrap_or_else(|| panic!("panel `{title}` has no targets"));
        assert!(!targets.is_empty(), "panel `{title}` has no targets");
        for t in targets {
            assert!(
                on_variable(&t["datasource"]),
                "panel `{title}`: a target's datasource {}",
                t["datasource"]
            );
            assert!(t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()), "panel `{title}`: {t}");
        }
        for key in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][key].is_u64(), "panel `{title}`: gridPos {}", p["gridPos"]);
        }
    }

    // Grafana's variables, as one value each, and every query as a recording
    // rule: `promtool check rules` parses them.
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let exprs: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    for (i, e) in exprs.iter().enumerate() {
        let e = e
            .replace("$__rate_interval", "1m")
            .replace("$node", ".*")
            .replace("$namespace", ".*")
            .replace("$pod", ".*");
        assert!(!e.contains('$') || e.contains("\"$1\""), "an unknown variable in {e}");
        rules.push_str(&format!(
            "      - record: dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(&e).unwrap()
        ));
    }
    let dir = Scratch::new("dashboard");
    let path = dir.path("dashboard-queries.yml");
    std::fs::write(&path, &rules).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("promtool (cargo xtask test installs it)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "a dashboard query is not PromQL: {text}\n{rules}");
    assert!(text.contains(&format!("SUCCESS: {} rules found", exprs.len())), "{text}");
}

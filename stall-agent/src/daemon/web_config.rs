//! `--web-config FILE`: TLS and basic authentication for the daemon's HTTP
//! server, in the file format of the Prometheus exporter toolkit, so the
//! file an operator keeps for node-exporter or dcgm-exporter serves stall
//! too. Paths in it are relative to the file.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use base64::Engine;
use serde::Deserialize;
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: PathBuf,
    key_file: PathBuf,
    #[serde(default)]
    client_auth_type: ClientAuth,
    client_ca_file: Option<PathBuf>,
    min_version: Option<Version>,
    max_version: Option<Version>,
}

/// The exporter toolkit's names (Go's `tls.ClientAuthType`); those that
/// accept a certificate without verifying it are refused.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
enum ClientAuth {
    #[default]
    NoClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
enum Version {
    TLS12,
    TLS13,
}

/// A web config, loaded and checked.
pub struct WebConfig {
    pub tls: Option<Arc<ServerConfig>>,
    /// Every connection presented a verified client certificate.
    pub clients_verified: bool,
    users: BTreeMap<String, String>,
    /// A hash at the users' cost, checked in place of an unknown user's:
    /// refusing an unknown name then takes as long as a wrong password, so
    /// the time of a refusal does not tell which users exist.
    decoy: String,
    /// What the daemon should say about the file at start, a line each.
    pub warnings: Vec<String>,
}

/// How a request stands with the web config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No or wrong credentials where they are required.
    Denied,
    /// Allowed without proving who it is.
    Anonymous,
    /// A valid password or a verified client certificate.
    Authenticated,
}

impl WebConfig {
    /// Reads and checks `path`: certificates, keys and hashes are loaded
    /// now, so a bad file fails at start with the reason.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        // An empty file (or comments only) is no document at all.
        let file: File = serde_yaml_ng::from_str::<Option<File>>(&text)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .unwrap_or_default();
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut cost = None;
        for (user, hash) in &file.basic_auth_users {
            let parts = hash.parse::<bcrypt::HashParts>().map_err(|e| {
                format!("{}: the password of {user:?} is not a bcrypt hash: {e}", path.display())
            })?;
            cost = cost.max(Some(parts.get_cost()));
        }
        let (tls, clients_verified) = match &file.tls_server_config {
            None => (None, false),
            Some(t) => (
                Some(Arc::new(server_config(t, dir).map_err(|e| format!("{}: {e}", path.display()))?)),
                t.client_auth_type == ClientAuth::RequireAndVerifyClientCert,
            ),
        };
        let mut warnings = Vec::new();
        if tls.is_none() && !file.basic_auth_users.is_empty() {
            warnings.push(format!(
                "--web-config {}: basic_auth_users without tls_server_config: passwords cross the network in clear",
                path.display()
            ));
        }
        if tls.is_none() && file.basic_auth_users.is_empty() {
            // The exporter toolkit serves such a file as plain HTTP without
            // passwords (it logs "TLS is disabled"); so does stall, aloud.
            warnings.push(format!(
                "--web-config {}: sets neither tls_server_config nor basic_auth_users: plain HTTP, no passwords",
                path.display()
            ));
        }
        let decoy = match cost {
            Some(cost) => {
                bcrypt::hash("no such user", cost).map_err(|e| format!("{}: {e}", path.display()))?
            }
            None => String::new(),
        };
        Ok(Self { tls, clients_verified, users: file.basic_auth_users, decoy, warnings })
    }

    /// Whether basic authentication is asked of every request.
    pub fn needs_password(&self) -> bool {
        !self.users.is_empty()
    }

    /// How a request stands where no password is asked.
    pub fn without_password(&self) -> Access {
        if self.clients_verified {
            Access::Authenticated
        } else {
            Access::Anonymous
        }
    }

    /// Whether an `Authorization` header carries a user's password. Slow
    /// by design (bcrypt: about 60 ms at cost 10), and as slow for a name
    /// that is no user's: run it off the serving thread.
    pub fn verify(&self, header: &str) -> bool {
        let Some((user, password)) = basic_credentials(header) else { return false };
        match self.users.get(&user) {
            Some(hash) => bcrypt::verify(&password, hash).unwrap_or(false),
            None => {
                let _ = bcrypt::verify(&password, &self.decoy);
                false
            }
        }
    }
}

/// `Basic base64(user:password)` → (user, password).
fn basic_credentials(header: &str) -> Option<(String, String)> {
    let (scheme, encoded) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

fn server_config(t: &TlsFile, dir: &Path) -> Result<ServerConfig, String> {
    let at = |p: &Path| dir.join(p);
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(at(&t.cert_file))
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| format!("cert_file {}: {e}", at(&t.cert_file).display()))?;
    if certs.is_empty() {
        return Err(format!("cert_file {}: no certificate in it", at(&t.cert_file).display()));
    }
    let key = PrivateKeyDer::from_pem_file(at(&t.key_file))
        .map_err(|e| format!("key_file {}: {e}", at(&t.key_file).display()))?;
    let min = t.min_version.unwrap_or(Version::TLS12);
    let max = t.max_version.unwrap_or(Version::TLS13);
    if min > max {
        return Err("min_version is above max_version".into());
    }
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [(Version::TLS12, &rustls::version::TLS12), (Version::TLS13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, p)| p)
            .collect();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| e.to_string())?;
    let builder = match (t.client_auth_type, &t.client_ca_file) {
        (ClientAuth::NoClientCert, _) => builder.with_no_client_auth(),
        (_, None) => return Err(format!("client_auth_type {:?} needs client_ca_file", t.client_auth_type)),
        (auth, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(at(ca))
                .map_err(|e| format!("client_ca_file {}: {e}", at(ca).display()))?
            {
                let cert = cert.map_err(|e| format!("client_ca_file {}: {e}", at(ca).display()))?;
                roots.add(cert).map_err(|e| format!("client_ca_file {}: {e}", at(ca).display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = if auth == ClientAuth::VerifyClientCertIfGiven {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| e.to_string())?)
        }
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| e.to_string())?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(users: &[(&str, &str)]) -> WebConfig {
        WebConfig {
            tls: None,
            clients_verified: false,
            users: users.iter().map(|(u, h)| (u.to_string(), h.to_string())).collect(),
            decoy: bcrypt::hash("decoy", 4).unwrap(),
            warnings: Vec::new(),
        }
    }

    fn basic(user: &str, password: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
    }

    #[test]
    fn passwords_are_checked_against_their_bcrypt_hash() {
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let c = config(&[("prometheus", &hash)]);
        assert!(!c.verify(&basic("prometheus", "wrong")));
        assert!(!c.verify(&basic("someone", "s3cret")));
        // The decoy's own password opens nothing.
        assert!(!c.verify(&basic("someone", "decoy")));
        assert!(!c.verify("Bearer abc"));
        assert!(c.verify(&basic("prometheus", "s3cret")));
        assert!(c.verify(&format!("basic  {}", &basic("prometheus", "s3cret")[6..])));
    }

    #[test]
    fn without_users_requests_are_anonymous() {
        assert_eq!(config(&[]).without_password(), Access::Anonymous);
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("stall-webcfg-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_bad_file_says_why() {
        let dir = scratch("bad");
        let write = |text: &str| {
            let p = dir.join("web.yml");
            std::fs::write(&p, text).unwrap();
            WebConfig::load(&p).err().unwrap_or_default()
        };
        assert!(write("basic_auth_users:\n  a: plain\n").contains("not a bcrypt hash"));
        assert!(
            write("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n").contains("cert_file")
        );
        assert!(write("tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [x]\n")
            .contains("unknown field"));
        assert!(write("http_server_config:\n  http2: true\n").contains("unknown field"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn passwords_without_tls_and_an_empty_file_are_warned_of() {
        let dir = scratch("warn");
        let load = |text: &str| {
            let p = dir.join("web.yml");
            std::fs::write(&p, text).unwrap();
            WebConfig::load(&p).unwrap()
        };
        let hash = bcrypt::hash("s3cret", 4).unwrap();
        let clear = load(&format!("basic_auth_users:\n  prometheus: '{hash}'\n"));
        assert!(clear.needs_password());
        assert_eq!(clear.warnings.len(), 1, "{:?}", clear.warnings);
        assert!(clear.warnings[0].contains("passwords cross the network in clear"), "{:?}", clear.warnings);
        for empty in ["", "# nothing yet\n", "{}\n"] {
            let c = load(empty);
            assert!(!c.needs_password() && c.tls.is_none());
            assert_eq!(c.without_password(), Access::Anonymous);
            assert_eq!(c.warnings.len(), 1, "{empty:?}: {:?}", c.warnings);
            assert!(c.warnings[0].contains("plain HTTP, no passwords"), "{:?}", c.warnings);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! TLS of an `https://` endpoint: one rustls client configuration (ring) for
//! gRPC and HTTP/protobuf, and a certificate problem named in one line.

use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, CertificateError, ClientConfig, RootCertStore};

use super::settings::{Named, Tls};

/// The client configuration: the CAs of `OTEL_EXPORTER_OTLP_CERTIFICATE`
/// when set, else the system's roots (webpki's when the system has none, as
/// in a distroless image); a client certificate for mutual TLS. (ALPN is
/// the connector's: h2 for gRPC, http/1.1 for HTTP.)
pub fn client_config(tls: &Tls) -> Result<ClientConfig> {
    let roots = match &tls.ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| anyhow!("{} {}: a certificate in it is not usable as a CA: {e}", ca.from, ca.path.display()))?;
            }
            roots
        }
        None => system_roots(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS set-up")?
        .with_root_certificates(roots);
    let config = match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert)?;
            let key = PrivateKeyDer::from_pem_file(&key.path)
                .map_err(|e| anyhow!("cannot read the client key {} {}: {}", key.from, key.path.display(), pem_error(&e)))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| anyhow!("the client certificate and key do not go together: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    Ok(config)
}

fn certificates(n: &Named) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(&n.path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow!("cannot read {} {}: {}", n.from, n.path.display(), pem_error(&e)))?;
    if certs.is_empty() {
        bail!("{} {} holds no PEM certificate (-----BEGIN CERTIFICATE-----)", n.from, n.path.display());
    }
    Ok(certs)
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    match e {
        rustls::pki_types::pem::Error::Io(io) => io.to_string(),
        rustls::pki_types::pem::Error::NoItemsFound => "no PEM item of that kind in it".into(),
        other => format!("not PEM: {other:?}"),
    }
}

/// The system's trusted roots, read once (parsing them takes milliseconds;
/// every client of the run shares them).
fn system_roots() -> RootCertStore {
    static ROOTS: std::sync::OnceLock<RootCertStore> = std::sync::OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            }
            roots
        })
        .clone()
}

/// A configuration that trusts nothing, for a plain-text endpoint's
/// connector (which never makes a TLS connection).
pub fn plain_config() -> Result<ClientConfig> {
    let b = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS set-up")?;
    Ok(b.with_root_certificates(RootCertStore::empty()).with_no_client_auth())
}

/// A TLS problem with `url` that a handshake of uvspan's own shows (and a
/// first read after it: under TLS 1.3 a refused client certificate is said
/// only then), named; None when the handshake and the read go through.
pub async fn handshake(config: Arc<ClientConfig>, url: &str, timeout: std::time::Duration) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']').to_string();
    let port = uri.port_u16().unwrap_or(443);
    let name = rustls::pki_types::ServerName::try_from(host.clone()).ok()?;
    let mut config = (*config).clone();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await.ok()?;
        let mut tls = match tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await {
            Ok(t) => t,
            Err(e) => return describe(&e),
        };
        // The client's side of HTTP/2 (its preface), then the server's first word.
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0").await.ok()?;
        let mut buf = [0u8; 64];
        match tls.read(&mut buf).await {
            Err(e) => describe(&e),
            Ok(_) => None,
        }
    };
    tokio::time::timeout(timeout, attempt).await.ok().flatten()
}

/// Whether an error is a TLS problem, and then what it is in one line (an
/// error's chain is walked, through the I/O errors that carry rustls's).
pub fn describe(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(r) = e.downcast_ref::<rustls::Error>() {
            return Some(name(r));
        }
        // An I/O error's source() skips the error it carries: look inside.
        let io = e.downcast_ref::<std::io::Error>().or_else(|| e.downcast_ref::<h2::Error>().and_then(h2::Error::get_io));
        if let Some(d) = io.and_then(std::io::Error::get_ref).and_then(|inner| describe(inner)) {
            return Some(d);
        }
        cur = e.source();
    }
    None
}

/// A rustls error as a person reads it: what, and what to do.
pub fn name(e: &rustls::Error) -> String {
    use rustls::Error::*;
    match e {
        InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer => "TLS: the collector's certificate is signed by a CA uvspan does not trust \
                 (give its CA in OTEL_EXPORTER_OTLP_CERTIFICATE)"
                .into(),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                "TLS: the collector's certificate is not for the endpoint's host name (use a name the certificate holds)".into()
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => "TLS: the collector's certificate has expired".into(),
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "TLS: the collector's certificate is not valid yet (check the clocks)".into()
            }
            other => format!("TLS: the collector's certificate is not acceptable: {other:?}"),
        },
        AlertReceived(AlertDescription::CertificateRequired) => "TLS: the collector requires a client certificate \
             (set OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY)"
            .into(),
        AlertReceived(a @ (AlertDescription::BadCertificate | AlertDescription::UnknownCA | AlertDescription::CertificateUnknown)) => {
            format!("TLS: the collector refused uvspan's client certificate ({a:?})")
        }
        InvalidMessage(_) => "TLS: the endpoint does not answer in TLS (is it http:// rather than https://?)".into(),
        other => format!("TLS: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificate_problems_are_named_through_io_errors() {
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, unknown);
        let outer = anyhow::Error::new(io).context("connecting");
        let d = describe(outer.as_ref()).expect("a TLS problem");
        assert!(d.contains("CA uvspan does not trust") && d.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"), "{d}");
        let expired = rustls::Error::InvalidCertificate(CertificateError::Expired);
        assert!(name(&expired).contains("expired"));
        let name_mismatch = rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        assert!(name(&name_mismatch).contains("host name"));
        assert!(name(&rustls::Error::AlertReceived(AlertDescription::CertificateRequired)).contains("client certificate"));
        let plain = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(describe(&plain), None);
    }

    #[test]
    fn unreadable_files_are_one_line_naming_the_variable() {
        let named = |p: &str| Named { path: p.into(), from: "OTEL_EXPORTER_OTLP_CERTIFICATE".into() };
        let e = client_config(&Tls { ca: Some(named("/nonexistent/ca.pem")), ..Default::default() }).unwrap_err().to_string();
        assert!(e.starts_with("cannot read OTEL_EXPORTER_OTLP_CERTIFICATE /nonexistent/ca.pem"), "{e}");
        let dir = std::env::temp_dir().join(format!("uvspan-tls-{}", std::process::id()));
        std::fs::write(&dir, "not a certificate").unwrap();
        let e = client_config(&Tls { ca: Some(named(dir.to_str().unwrap())), ..Default::default() }).unwrap_err().to_string();
        std::fs::remove_file(&dir).unwrap();
        assert!(e.contains("holds no PEM certificate"), "{e}");
        assert!(client_config(&Tls::default()).is_ok(), "system roots");
    }
}

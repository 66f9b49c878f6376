//! Certificates for TLS members, generated in the test with rcgen.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

use super::HarnessError;
use crate::etcd::TlsOptions;

/// The names a member's certificate is issued for: the endpoints the harness gives out use
/// `localhost` or a loopback address.
const SERVER_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A throwaway certificate authority with a server certificate for etcd members and a client
/// certificate, generated with rcgen (ECDSA P-256). Every [`generate`](Self::generate) makes a
/// new CA, so two of them do not trust each other's certificates.
///
/// ```no_run
/// use leasehold::testing::{EtcdNode, TestCertificates};
///
/// # async fn example() -> Result<(), leasehold::testing::HarnessError> {
/// let certificates = TestCertificates::generate()?;
/// let etcd = EtcdNode::builder().tls(certificates.clone()).start().await?; // https://, client certificates required
/// let tls = certificates.client_tls();                                       // CA + client certificate
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TestCertificates {
    ca: String,
    authority: Arc<(Certificate, KeyPair)>,
    server: (String, String),
    client: (String, String),
}

impl std::fmt::Debug for TestCertificates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCertificates").finish_non_exhaustive()
    }
}

fn harness(error: rcgen::Error) -> HarnessError {
    HarnessError::io(
        "generate test certificates",
        std::io::Error::other(error.to_string()),
    )
}

impl TestCertificates {
    /// A new CA, a server certificate for `localhost`, `127.0.0.1` and `::1`, and a client
    /// certificate (common name `leasehold-test-client`).
    pub fn generate() -> Result<Self, HarnessError> {
        let ca_key = KeyPair::generate().map_err(harness)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(harness)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "leasehold test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = params.self_signed(&ca_key).map_err(harness)?;
        let mut certificates = Self {
            ca: ca.pem(),
            authority: Arc::new((ca, ca_key)),
            server: (String::new(), String::new()),
            client: (String::new(), String::new()),
        };
        certificates.server = certificates.issue(
            "etcd",
            &SERVER_NAMES,
            &[
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            false,
        )?;
        certificates.client = certificates.client_certificate("leasehold-test-client")?;
        Ok(certificates)
    }

    /// The CA certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca
    }

    /// The members' certificate and key (PEM).
    pub fn server_pem(&self) -> (&str, &str) {
        (&self.server.0, &self.server.1)
    }

    /// The client certificate and key (PEM).
    pub fn client_pem(&self) -> (&str, &str) {
        (&self.client.0, &self.client.1)
    }

    /// TLS options that trust this CA and present the client certificate.
    pub fn client_tls(&self) -> TlsOptions {
        TlsOptions::new(self.ca.as_bytes())
            .with_client_identity(self.client.0.as_bytes(), self.client.1.as_bytes())
    }

    /// A new client certificate and key (PEM) signed by this CA, with common name `name`.
    pub fn client_certificate(&self, name: &str) -> Result<(String, String), HarnessError> {
        self.issue(name, &[], &[ExtendedKeyUsagePurpose::ClientAuth], false)
    }

    /// A client certificate and key (PEM) signed by this CA that expired in 2021.
    pub fn expired_client_certificate(&self) -> Result<(String, String), HarnessError> {
        self.issue(
            "leasehold-expired-client",
            &[],
            &[ExtendedKeyUsagePurpose::ClientAuth],
            true,
        )
    }

    fn issue(
        &self,
        name: &str,
        alt_names: &[&str],
        usages: &[ExtendedKeyUsagePurpose],
        expired: bool,
    ) -> Result<(String, String), HarnessError> {
        let (ca, ca_key) = &*self.authority;
        let key = KeyPair::generate().map_err(harness)?;
        let names: Vec<String> = alt_names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).map_err(harness)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = usages.to_vec();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let certificate = params.signed_by(&key, ca, ca_key).map_err(harness)?;
        Ok((certificate.pem(), key.serialize_pem()))
    }
}

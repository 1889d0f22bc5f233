//! rustls verifiers for both trust modes, on both ends of a connection.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::server::ParsedCertificate;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::identity::{Identity, Trust, TrustKind};

fn refused() -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)
}

/// Server side: requires a client certificate that is trusted under the mode (pinned, or
/// chaining to the CA) and currently valid. Which identity it has is decided after the
/// handshake by [`Trust::classify`], so a trusted stranger gets a 403 rather than an alert.
///
/// The trust map is read at each handshake, so a replaced one ([`Trust::replace`])
/// decides the next connection.
#[derive(Debug)]
pub(crate) struct ClientVerifier {
    trust: Arc<Trust>,
    algs: WebPkiSupportedAlgorithms,
}

impl ClientVerifier {
    /// # Errors
    ///
    /// The trust's CA cannot verify client certificates.
    pub(crate) fn new(
        trust: Arc<Trust>,
        provider: &Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Self, String> {
        if let Some(Err(e)) = trust.kind().client_chain() {
            return Err(e);
        }
        Ok(Self {
            trust,
            algs: provider.signature_verification_algorithms,
        })
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self.trust.kind().client_chain() {
            Some(Ok(webpki)) => return webpki.verify_client_cert(end_entity, intermediates, now),
            Some(Err(_)) => return Err(refused()),
            None => {}
        }
        Trust::check_validity(end_entity, now)?;
        if self.trust.classify(end_entity).is_none() {
            return Err(refused());
        }
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

/// Client side: the server must be trusted under the mode and be exactly the identity
/// the connection was opened for. DNS names are not checked: the identity is the pin or
/// the SPIFFE ID, and peers are reached by whatever address the configuration gives.
#[derive(Debug)]
pub(crate) struct ServerVerifier {
    trust: Arc<Trust>,
    expected: Identity,
    algs: WebPkiSupportedAlgorithms,
}

impl ServerVerifier {
    pub(crate) fn new(
        trust: Arc<Trust>,
        expected: Identity,
        provider: &rustls::crypto::CryptoProvider,
    ) -> Self {
        Self {
            trust,
            expected,
            algs: provider.signature_verification_algorithms,
        }
    }
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &*self.trust.kind() {
            TrustKind::Spiffe { roots, .. } => {
                let parsed = ParsedCertificate::try_from(end_entity)?;
                rustls::client::verify_server_cert_signed_by_trust_anchor(
                    &parsed,
                    roots,
                    intermediates,
                    now,
                    self.algs.all,
                )?;
            }
            TrustKind::Pin { .. } => Trust::check_validity(end_entity, now)?,
        }
        if self.trust.classify(end_entity).as_ref() != Some(&self.expected) {
            return Err(refused());
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

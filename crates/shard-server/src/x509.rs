//! The few facts of an X.509 certificate shard reads itself, for the certificates `webpki`
//! refuses and OpenSSL (so nginx) takes: version 1 certificates, which `openssl req -x509` and
//! `openssl x509 -req` make when no extensions are asked for.
//!
//! It owns a DER walk over the `TBSCertificate` (any version), the check that one certificate
//! signed another, and the match of a private key to a certificate by its public key. It does
//! not build chains beyond one issuer, read extensions or judge names: `webpki` does that for
//! every certificate it can parse, and this module is only asked when it cannot.

use rustls::pki_types::{CertificateDer, SignatureVerificationAlgorithm};

/// A DER element at the start of `b`: its tag, its content, and what follows it.
pub(crate) fn der(b: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, b) = b.split_first()?;
    let (&l0, mut b) = b.split_first()?;
    let len = if l0 < 0x80 {
        usize::from(l0)
    } else {
        let n = usize::from(l0 & 0x7f);
        if n == 0 || n > 4 || b.len() < n {
            return None;
        }
        let len = b[..n].iter().fold(0usize, |a, &x| a << 8 | usize::from(x));
        b = &b[n..];
        len
    };
    (b.len() >= len).then(|| (tag, &b[..len], &b[len..]))
}

/// A certificate's `notBefore` and `notAfter`, unix seconds.
pub(crate) fn validity(cert: &[u8]) -> Option<(u64, u64)> {
    let (0x30, c, _) = der(cert)? else {
        return None;
    };
    let (0x30, mut tbs, _) = der(c)? else {
        return None;
    };
    if tbs.first() == Some(&0xa0) {
        tbs = der(tbs)?.2; // [0] version
    }
    let rest = der(tbs)?.2; // serial
    let rest = der(rest)?.2; // signature algorithm
    let rest = der(rest)?.2; // issuer
    let (0x30, validity, _) = der(rest)? else {
        return None;
    };
    let (t1, v1, r) = der(validity)?;
    let (t2, v2, _) = der(r)?;
    Some((asn1_time(t1, v1)?, asn1_time(t2, v2)?))
}

/// An X.509 `UTCTime` (`YYMMDDHHMMSSZ`) or `GeneralizedTime` (`YYYYMMDDHHMMSSZ`) as unix
/// seconds.
pub(crate) fn asn1_time(tag: u8, v: &[u8]) -> Option<u64> {
    let digits = |b: &[u8]| -> Option<u64> {
        b.iter().try_fold(0u64, |a, &d| {
            d.is_ascii_digit().then(|| a * 10 + u64::from(d - b'0'))
        })
    };
    let (year, rest) = match (tag, v.len()) {
        (0x17, 13) => {
            let yy = digits(&v[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &v[2..])
        }
        (0x18, 15) => (digits(&v[..4])?, &v[4..]),
        _ => return None,
    };
    let (m, d) = (digits(&rest[..2])?, digits(&rest[2..4])?);
    let (h, mi, s) = (
        digits(&rest[4..6])?,
        digits(&rest[6..8])?,
        digits(&rest[8..10])?,
    );
    if rest[10] != b'Z' || !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Days from 1970-01-01 (Howard Hinnant's days_from_civil).
    let (y, m) = if m <= 2 {
        (year - 1, m + 9)
    } else {
        (year, m - 3)
    };
    let era = y / 400;
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = (era * 146_097 + doe).checked_sub(719_468)?;
    Some(days * 86_400 + h * 3600 + mi * 60 + s)
}

/// A certificate's parts, borrowed from its DER.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cert<'a> {
    /// The whole `TBSCertificate` element: what the issuer signed.
    pub tbs: &'a [u8],
    /// The serial number's `INTEGER` content.
    pub serial: &'a [u8],
    /// The issuer's and the subject's `Name`, whole elements (tag included).
    pub issuer: &'a [u8],
    pub subject: &'a [u8],
    /// The whole `SubjectPublicKeyInfo` element.
    pub spki: &'a [u8],
    /// The content of its `AlgorithmIdentifier`, and its key (the `BIT STRING`'s bits).
    pub spki_alg: &'a [u8],
    pub public_key: &'a [u8],
    /// The content of the outer `signatureAlgorithm`, and the signature's bits.
    pub sig_alg: &'a [u8],
    pub signature: &'a [u8],
}

/// The whole element at the start of `b` (tag and length included) and what follows it.
fn whole(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (_, _, rest) = der(b)?;
    Some((&b[..b.len() - rest.len()], rest))
}

/// A `BIT STRING`'s bits, when it has no unused bits.
fn bits(tag: u8, content: &[u8]) -> Option<&[u8]> {
    match (tag, content.split_first()) {
        (0x03, Some((0, bits))) => Some(bits),
        _ => None,
    }
}

/// The parts of a DER certificate, whatever its version; `None` when it is not one.
pub(crate) fn parse(cert: &[u8]) -> Option<Cert<'_>> {
    let (0x30, c, _) = der(cert)? else {
        return None;
    };
    let (tbs, rest) = whole(c)?;
    let (0x30, sig_alg, rest) = der(rest)? else {
        return None;
    };
    let (t, sig, _) = der(rest)?;
    let signature = bits(t, sig)?;
    let (0x30, mut t, _) = der(tbs)? else {
        return None;
    };
    if t.first() == Some(&0xa0) {
        t = der(t)?.2; // [0] version: absent in a version 1 certificate
    }
    let (0x02, serial, t) = der(t)? else {
        return None;
    };
    let (_, _, t) = der(t)?; // signature
    let (issuer, t) = whole(t)?;
    let (_, _, t) = der(t)?; // validity
    let (subject, t) = whole(t)?;
    let (spki, _) = whole(t)?;
    let (0x30, s, _) = der(spki)? else {
        return None;
    };
    let (0x30, spki_alg, s) = der(s)? else {
        return None;
    };
    let (t, k, _) = der(s)?;
    Some(Cert {
        tbs,
        serial,
        issuer,
        subject,
        spki,
        spki_alg,
        public_key: bits(t, k)?,
        sig_alg,
        signature,
    })
}

/// The values of the subject's common names (`CN`), in DER order.
pub(crate) fn subject_cns<'a>(cert: &Cert<'a>) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let Some((0x30, mut rest, _)) = der(cert.subject) else {
        return out;
    };
    while let Some((0x31, set, r)) = der(rest) {
        rest = r;
        let mut s = set;
        while let Some((0x30, atv, r2)) = der(s) {
            s = r2;
            if let Some((0x06, [0x55, 0x04, 0x03], value)) = der(atv) {
                if let Some((_, v, _)) = der(value) {
                    out.push(v);
                }
            }
        }
    }
    out
}

/// Whether the certificate's `subjectAltName` lists a DNS name (then, as OpenSSL's
/// `X509_check_host`, its common name is not a name it is valid for).
pub(crate) fn has_dns_san(cert: &Cert<'_>) -> bool {
    !dns_sans(cert).is_empty()
}

/// The DNS names of the certificate's `subjectAltName`.
pub(crate) fn dns_sans<'a>(cert: &Cert<'a>) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    // TBSCertificate: ... subjectPublicKeyInfo, then [1] [2] unique ids, [3] extensions.
    let Some((0x30, tbs, _)) = der(cert.tbs) else {
        return out;
    };
    let Some(at) = tbs
        .windows(cert.spki.len())
        .position(|w| w == cert.spki)
        .map(|i| i + cert.spki.len())
    else {
        return out;
    };
    let mut rest = &tbs[at..];
    while let Some((tag, content, r)) = der(rest) {
        rest = r;
        if tag != 0xa3 {
            continue;
        }
        let Some((0x30, mut exts, _)) = der(content) else {
            return out;
        };
        while let Some((0x30, ext, r2)) = der(exts) {
            exts = r2;
            let Some((0x06, oid, mut e)) = der(ext) else {
                continue;
            };
            if oid != [0x55, 0x1d, 0x11] {
                continue;
            }
            if let Some((0x01, _, r3)) = der(e) {
                e = r3; // critical
            }
            let Some((0x04, value, _)) = der(e) else {
                return out;
            };
            let Some((0x30, mut names, _)) = der(value) else {
                return out;
            };
            while let Some((tag, name, r4)) = der(names) {
                names = r4;
                if tag == 0x82 {
                    out.push(name);
                }
            }
            return out;
        }
    }
    out
}

/// Whether `pattern` (a certificate's name) matches host `name` as OpenSSL's
/// `X509_check_host` does with nginx's flags: without case, a `*` allowed as the whole
/// leftmost label of a pattern of three labels or more, matching one label.
pub(crate) fn host_matches(pattern: &[u8], name: &str) -> bool {
    let Ok(pattern) = std::str::from_utf8(pattern) else {
        return false;
    };
    let name = name.trim_end_matches('.');
    if pattern.eq_ignore_ascii_case(name) {
        return true;
    }
    let Some(suffix) = pattern.strip_prefix("*.") else {
        return false;
    };
    if suffix.split('.').count() < 2 {
        return false;
    }
    match name.split_once('.') {
        Some((label, rest)) => !label.is_empty() && rest.eq_ignore_ascii_case(suffix),
        None => false,
    }
}

/// A certificate revocation list's parts, borrowed from its DER, whatever its version
/// (`openssl ca -gencrl` writes version 1 lists when no CRL extensions are configured, and
/// `webpki` reads only version 2).
#[derive(Debug, Clone)]
pub(crate) struct Crl<'a> {
    /// The whole `TBSCertList` element: what the issuer signed.
    pub tbs: &'a [u8],
    /// The issuer's `Name`, the whole element.
    pub issuer: &'a [u8],
    /// `nextUpdate`, unix seconds (`None`: the list does not say).
    pub next_update: Option<u64>,
    /// The revoked certificates' serial numbers (`INTEGER` contents).
    pub revoked: Vec<&'a [u8]>,
    pub sig_alg: &'a [u8],
    pub signature: &'a [u8],
}

/// The parts of a DER certificate revocation list; `None` when it is not one.
pub(crate) fn parse_crl(crl: &[u8]) -> Option<Crl<'_>> {
    let (0x30, c, _) = der(crl)? else {
        return None;
    };
    let (tbs, rest) = whole(c)?;
    let (0x30, sig_alg, rest) = der(rest)? else {
        return None;
    };
    let (t, sig, _) = der(rest)?;
    let signature = bits(t, sig)?;
    let (0x30, mut t, _) = der(tbs)? else {
        return None;
    };
    if t.first() == Some(&0x02) {
        t = der(t)?.2; // version: absent in a version 1 list
    }
    let (0x30, _, t) = der(t)? else {
        return None; // signature algorithm
    };
    let (issuer, t) = whole(t)?;
    let (tag, this, mut t) = der(t)?;
    asn1_time(tag, this)?;
    let mut next_update = None;
    if let Some((tag @ (0x17 | 0x18), v, rest)) = der(t) {
        next_update = Some(asn1_time(tag, v)?);
        t = rest;
    }
    let mut revoked = Vec::new();
    if let Some((0x30, mut list, _)) = der(t) {
        while !list.is_empty() {
            let (0x30, entry, rest) = der(list)? else {
                return None;
            };
            let (0x02, serial, _) = der(entry)? else {
                return None;
            };
            revoked.push(serial);
            list = rest;
        }
    }
    Some(Crl {
        tbs,
        issuer,
        next_update,
        revoked,
        sig_alg,
        signature,
    })
}

/// Whether `crl` carries a signature of `issuer`'s key, by one of `algs`.
pub(crate) fn crl_signed_by(
    crl: &Crl<'_>,
    issuer: &Cert<'_>,
    algs: &[&'static dyn SignatureVerificationAlgorithm],
) -> bool {
    algs.iter()
        .filter(|a| {
            a.signature_alg_id().as_ref() == crl.sig_alg
                && a.public_key_alg_id().as_ref() == issuer.spki_alg
        })
        .any(|a| {
            a.verify_signature(issuer.public_key, crl.tbs, crl.signature)
                .is_ok()
        })
}

/// Whether `cert` carries a signature of `issuer`'s key, by one of `algs` (the algorithm the
/// certificate names, for the issuer's kind of key).
pub(crate) fn signed_by(
    cert: &Cert<'_>,
    issuer: &Cert<'_>,
    algs: &[&'static dyn SignatureVerificationAlgorithm],
) -> bool {
    algs.iter()
        .filter(|a| {
            a.signature_alg_id().as_ref() == cert.sig_alg
                && a.public_key_alg_id().as_ref() == issuer.spki_alg
        })
        .any(|a| {
            a.verify_signature(issuer.public_key, cert.tbs, cert.signature)
                .is_ok()
        })
}

/// The first of `cas` that issued `cert` (its subject is `cert`'s issuer and its key signed
/// `cert`), as OpenSSL finds a trusted issuer by name and then checks the signature.
pub(crate) fn trusted_issuer<'c>(
    cert: &Cert<'_>,
    cas: &'c [CertificateDer<'static>],
    algs: &[&'static dyn SignatureVerificationAlgorithm],
) -> Option<Cert<'c>> {
    cas.iter()
        .filter_map(|ca| parse(ca))
        .find(|ca| ca.subject == cert.issuer && signed_by(cert, ca, algs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_names_of_a_certificate_without_alt_names() {
        let d = pem_der(V1_SELF_SIGNED);
        let c = parse(&d).unwrap();
        assert_eq!(subject_cns(&c), [&b"v1.test"[..]]);
        assert!(!has_dns_san(&c));
    }

    #[test]
    fn host_names_match_as_openssl_checks_them() {
        assert!(host_matches(b"Cn.Test", "cn.test"));
        assert!(host_matches(b"cn.test", "cn.test."));
        assert!(host_matches(b"*.example.com", "a.example.com"));
        assert!(!host_matches(b"*.example.com", "a.b.example.com"));
        assert!(!host_matches(b"*.example.com", "example.com"));
        assert!(!host_matches(b"*.com", "a.com"), "too few labels");
        assert!(!host_matches(b"a*.example.com", "ab.example.com"));
        assert!(!host_matches(b"other.test", "cn.test"));
    }

    /// A certificate made with `openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256
    /// -days 36500 -nodes` under a configuration without `x509_extensions` (`CN = v1.test`):
    /// version 1 (no `[0]` version field), self-signed.
    const V1_SELF_SIGNED: &str = "\
MIIBITCBxwIUUuxqB3tVzYqr//Nl+DRoFs5JCiswCgYIKoZIzj0EAwIwEjEQMA4G
A1UEAwwHdjEudGVzdDAgFw0yNjExMjYyMDQ1NTNaGA8yMTI2MTEwMjIwNDU1M1ow
EjEQMA4GA1UEAwwHdjEudGVzdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABNrf
zg6CugxGGY0B79Rs+7Ht571uPXfSA4AvAmGEPGpYQO8Yanz5sUgTV5EBMOszI8BF
VZBXk3pBl7ZY8Rbk4G0wCgYIKoZIzj0EAwIDSQAwRgIhAKFya1zIF81Q2MfoLJTq
U8faQzr/MvbDuOmRuDQJXwqlAiEA/v2KHZcQmppXk9PXOrSWGPKgKlWgHVY4H1q6
dFiXj0I=";

    fn pem_der(b64: &str) -> Vec<u8> {
        let text = format!("-----BEGIN CERTIFICATE-----\n{b64}\n-----END CERTIFICATE-----\n");
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(text.as_bytes())
            .unwrap()
            .to_vec()
    }

    #[test]
    fn a_version_1_certificate_is_read() {
        let d = pem_der(V1_SELF_SIGNED);
        let c = parse(&d).expect("parsed");
        // The TBSCertificate (at 4) starts with the serial (INTEGER), no [0] version field.
        assert_eq!((d[4], d[7]), (0x30, 0x02), "a v1 certificate");
        assert_eq!(c.issuer, c.subject);
        // id-ecPublicKey, prime256v1.
        assert!(c
            .spki_alg
            .starts_with(&[0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01]));
        assert_eq!(c.public_key.len(), 65);
        assert!(parse(&d[..d.len() - 1]).is_none());
        assert!(parse(b"\x30\x00").is_none());
        // It signed itself, with ECDSA P-256 SHA-256.
        let algs = rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .all;
        assert!(signed_by(&c, &c, algs));
        let mut bad = d.clone();
        let n = bad.len();
        bad[n - 3] ^= 1; // inside the signature
        let b = parse(&bad).unwrap();
        assert!(!signed_by(&b, &c, algs));
        assert!(trusted_issuer(&c, &[CertificateDer::from(d.clone())], algs).is_some());
    }
}

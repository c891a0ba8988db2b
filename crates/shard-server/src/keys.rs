//! Private keys as nginx's OpenSSL reads them: PEM files, plain or encrypted with a
//! passphrase from `ssl_password_file` (PKCS#8 `ENCRYPTED PRIVATE KEY`, as OpenSSL 3 writes
//! it, and the older `Proc-Type: 4,ENCRYPTED` form of `openssl rsa -aes256 -traditional`).
//!
//! Owns reading and decrypting only: what the key is for (serving, client certificates to
//! upstreams) is `tls.rs`'s.

use std::path::Path;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs1KeyDer, PrivatePkcs8KeyDer, PrivateSec1KeyDer};

/// The passphrases of an `ssl_password_file`: one per line, as nginx reads it (a line's
/// CR is not part of it; empty lines are skipped).
pub fn read_passwords(path: &Path) -> Result<Vec<Vec<u8>>, String> {
    let text = read_whole(path)?;
    let list: Vec<Vec<u8>> = text
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if list.is_empty() {
        return Err(format!("empty file \"{}\"", path.display()));
    }
    Ok(list)
}

/// A whole file the master reads at load (keys' passphrases, ticket keys, OCSP responses);
/// the error as nginx's: `open() "PATH" failed (2: No such file or directory)`.
pub fn read_whole(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| {
        format!(
            "open() \"{}\" failed ({})",
            path.display(),
            shard_event::os_error_text(&e)
        )
    })
}

/// The encrypted key in `path`, decrypted with the first of `passwords` that opens it;
/// `Ok(None)` when the key is not encrypted (the caller reads it as plain PEM). Errors are
/// the text after nginx's `cannot load certificate key "PATH": `.
pub fn load_encrypted_key(
    path: &Path,
    passwords: &[Vec<u8>],
) -> Result<Option<PrivateKeyDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| shard_event::os_error_text(&e))?;
    let encrypted_pkcs8 = find(&pem, b"-----BEGIN ENCRYPTED PRIVATE KEY-----").is_some();
    let legacy = find(&pem, b"Proc-Type: 4,ENCRYPTED").is_some();
    if !encrypted_pkcs8 && !legacy {
        return Ok(None);
    }
    if passwords.is_empty() {
        return Err(
            "the key is encrypted and no \"ssl_password_file\" gives its passphrase".to_string(),
        );
    }
    for pass in passwords {
        let key = if encrypted_pkcs8 {
            decrypt_pkcs8(&pem, pass)
        } else {
            decrypt_legacy(&pem, pass)
        };
        if let Some(k) = key {
            return Ok(Some(k));
        }
    }
    Err("no passphrase of \"ssl_password_file\" decrypts it (bad decrypt)".to_string())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Header lines of a PEM block (`Name: value`).
type PemHeaders = Vec<(String, String)>;

/// The first PEM block labelled `label` in `pem`: its header lines and its decoded body.
fn pem_block(pem: &[u8], label: &str) -> Option<(PemHeaders, Vec<u8>)> {
    let text = std::str::from_utf8(pem).ok()?;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin)? + begin.len();
    let stop = start + text[start..].find(&end)?;
    let mut headers = Vec::new();
    let mut body = String::new();
    for line in text[start..stop].lines() {
        let line = line.trim();
        if let Some((k, v)) = line.split_once(": ") {
            headers.push((k.to_string(), v.to_string()));
        } else {
            body.push_str(line);
        }
    }
    Some((headers, shard_http::base64_decode(&body)?))
}

/// PKCS#8 `ENCRYPTED PRIVATE KEY` (PBES2: PBKDF2 or scrypt, AES or 3DES).
fn decrypt_pkcs8(pem: &[u8], pass: &[u8]) -> Option<PrivateKeyDer<'static>> {
    let (_, der) = pem_block(pem, "ENCRYPTED PRIVATE KEY")?;
    let info = pkcs8::EncryptedPrivateKeyInfo::try_from(der.as_slice()).ok()?;
    let plain = info.decrypt(pass).ok()?;
    // A wrong passphrase can pass the padding check by chance: the result must read as a
    // PKCS#8 structure.
    pkcs8::PrivateKeyInfo::try_from(plain.as_bytes()).ok()?;
    Some(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        plain.as_bytes().to_vec(),
    )))
}

/// `Proc-Type: 4,ENCRYPTED` with `DEK-Info: CIPHER,IV` (OpenSSL's traditional form): the
/// key is `EVP_BytesToKey(MD5, salt = the IV's first 8 bytes, one round)`.
fn decrypt_legacy(pem: &[u8], pass: &[u8]) -> Option<PrivateKeyDer<'static>> {
    let (label, kind) = [
        ("RSA PRIVATE KEY", 0u8),
        ("EC PRIVATE KEY", 1),
        ("PRIVATE KEY", 2),
    ]
    .into_iter()
    .find(|(l, _)| find(pem, format!("-----BEGIN {l}-----").as_bytes()).is_some())?;
    let (headers, body) = pem_block(pem, label)?;
    let dek = headers.iter().find(|(k, _)| k == "DEK-Info")?.1.clone();
    let (cipher, iv_hex) = dek.split_once(',')?;
    let iv = hex(iv_hex.trim())?;
    let key_len = match cipher {
        "AES-128-CBC" => 16,
        "AES-192-CBC" => 24,
        "AES-256-CBC" => 32,
        "DES-EDE3-CBC" => 24,
        "DES-CBC" => 8,
        _ => return None,
    };
    let key = bytes_to_key(pass, iv.get(..8)?, key_len);
    let plain = cbc_decrypt(cipher, &key, &iv, &body)?;
    // DER SEQUENCE, or a wrong passphrase whose padding happened to check.
    if plain.first() != Some(&0x30) {
        return None;
    }
    Some(match kind {
        0 => PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(plain)),
        1 => PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(plain)),
        _ => PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(plain)),
    })
}

/// OpenSSL's `EVP_BytesToKey` with MD5 and one iteration.
fn bytes_to_key(pass: &[u8], salt: &[u8], len: usize) -> Vec<u8> {
    use md5::{Digest, Md5};
    let mut out = Vec::new();
    let mut prev: Vec<u8> = Vec::new();
    while out.len() < len {
        let mut h = Md5::new();
        h.update(&prev);
        h.update(pass);
        h.update(salt);
        prev = h.finalize().to_vec();
        out.extend_from_slice(&prev);
    }
    out.truncate(len);
    out
}

fn cbc_decrypt(cipher: &str, key: &[u8], iv: &[u8], data: &[u8]) -> Option<Vec<u8>> {
    use cbc::cipher::{block_padding::Pkcs7, BlockDecryptMut, KeyIvInit};
    fn run<C: cbc::cipher::BlockDecrypt + cbc::cipher::BlockCipher + cbc::cipher::KeyInit>(
        key: &[u8],
        iv: &[u8],
        data: &[u8],
    ) -> Option<Vec<u8>> {
        cbc::Decryptor::<C>::new_from_slices(key, iv)
            .ok()?
            .decrypt_padded_vec_mut::<Pkcs7>(data)
            .ok()
    }
    match cipher {
        "AES-128-CBC" => run::<aes::Aes128>(key, iv, data),
        "AES-192-CBC" => run::<aes::Aes192>(key, iv, data),
        "AES-256-CBC" => run::<aes::Aes256>(key, iv, data),
        "DES-EDE3-CBC" => run::<des::TdesEde3>(key, iv, data),
        "DES-CBC" => run::<des::Des>(key, iv, data),
        _ => None,
    }
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evp_bytes_to_key_matches_openssl() {
        // Each 16 bytes are MD5(previous block || passphrase || salt), as OpenSSL's
        // `EVP_BytesToKey(EVP_md5(), ..., 1)`.
        let k = bytes_to_key(b"secret", &[1, 2, 3, 4, 5, 6, 7, 8], 32);
        assert_eq!(k.len(), 32);
        use md5::{Digest, Md5};
        let first = Md5::digest([&b"secret"[..], &[1, 2, 3, 4, 5, 6, 7, 8]].concat());
        assert_eq!(&k[..16], first.as_slice());
        let second = Md5::digest([first.as_slice(), b"secret", &[1, 2, 3, 4, 5, 6, 7, 8]].concat());
        assert_eq!(&k[16..], second.as_slice());
    }

    #[test]
    fn passwords_one_per_line() {
        let dir = std::env::temp_dir().join(format!("shard-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("pw");
        std::fs::write(&f, b"first\r\n\nsecond\nthird").unwrap();
        assert_eq!(
            read_passwords(&f).unwrap(),
            vec![b"first".to_vec(), b"second".to_vec(), b"third".to_vec()]
        );
        std::fs::write(&f, b"\n").unwrap();
        assert!(read_passwords(&f).unwrap_err().contains("empty file"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

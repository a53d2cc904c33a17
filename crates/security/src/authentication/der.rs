//! The little DER needed to unwrap keys: SubjectPublicKeyInfo (X.509 public keys, as Java's
//! `PublicKey.getEncoded()` writes them) and PKCS#8 PrivateKeyInfo.

/// OID 1.2.840.113549.1.1.1 (rsaEncryption), content bytes.
pub const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
/// OID 1.2.840.10045.2.1 (id-ecPublicKey), content bytes.
pub const OID_EC: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

/// Reads one TLV: its tag, its content and what follows it.
pub fn read_tlv(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let mut len = 0usize;
        for &b in &rest[..count] {
            len = (len << 8) | usize::from(b);
        }
        rest = &rest[count..];
        len
    };
    if rest.len() < len {
        return None;
    }
    Some((tag, &rest[..len], &rest[len..]))
}

/// The algorithm OID and the key bytes of a SubjectPublicKeyInfo (for RSA the PKCS#1
/// RSAPublicKey, for EC the uncompressed point).
pub fn parse_spki(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let (0x30, body, _) = read_tlv(der)? else { return None };
    let (0x30, algorithm, rest) = read_tlv(body)? else { return None };
    let (0x06, oid, _) = read_tlv(algorithm)? else { return None };
    let (0x03, bits, _) = read_tlv(rest)? else { return None };
    let (&unused, key) = bits.split_first()?;
    (unused == 0).then_some((oid, key))
}

/// The algorithm OID and the private key octets of a PKCS#8 PrivateKeyInfo (for RSA the
/// PKCS#1 RSAPrivateKey).
pub fn parse_pkcs8(der: &[u8]) -> Option<(&[u8], &[u8])> {
    let (0x30, body, _) = read_tlv(der)? else { return None };
    let (0x02, _version, rest) = read_tlv(body)? else { return None };
    let (0x30, algorithm, rest) = read_tlv(rest)? else { return None };
    let (0x06, oid, _) = read_tlv(algorithm)? else { return None };
    let (0x04, key, _) = read_tlv(rest)? else { return None };
    Some((oid, key))
}

/// Wraps `content` in a TLV with `tag`.
pub fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len.to_be_bytes().iter().copied().skip_while(|&b| b == 0).collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend_from_slice(&bytes);
    }
    out.extend_from_slice(content);
    out
}

/// A SubjectPublicKeyInfo from an algorithm identifier (its inner content) and key bytes.
pub fn spki(algorithm_content: &[u8], key: &[u8]) -> Vec<u8> {
    let mut bits = vec![0u8];
    bits.extend_from_slice(key);
    let mut body = tlv(0x30, algorithm_content);
    body.extend(tlv(0x03, &bits));
    tlv(0x30, &body)
}

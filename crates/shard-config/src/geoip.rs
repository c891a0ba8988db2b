//! Legacy GeoIP databases (MaxMind's `.dat` format), as nginx's `geoip_country`,
//! `geoip_city` and `geoip_org` read them through libGeoIP: loaded whole when the
//! configuration is read, then looked up in memory by the workers.
//!
//! This module owns the format: the structure info at the file's end (edition, segments),
//! the binary tree walked bit by bit of the address (32 levels for IPv4 editions, 128 for
//! IPv6 ones), country ids, city records and organization names, and the country and
//! region tables of `geoip_data.rs`. What a variable shows is `shard_http::vars`'s.

use std::net::IpAddr;

/// A country database's first leaf value: a leaf is `COUNTRY_BEGIN + id`.
const COUNTRY_BEGIN: u32 = 16_776_960;
/// Where the structure info may start, counted back from the end.
const STRUCTURE_INFO_MAX: usize = 20;
/// A database larger than this is not read (the city databases MaxMind shipped were ~30 MB).
pub const DB_MAX_BYTES: u64 = 512 << 20;

/// Which kind of lookup a database answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edition {
    Country,
    City { rev1: bool },
    Org,
}

/// A database read into memory.
#[derive(Debug)]
pub struct Db {
    data: Vec<u8>,
    pub edition: Edition,
    /// Keys of 128 bits (an IPv6 edition), else 32.
    pub v6: bool,
    segments: u32,
    record_len: usize,
}

/// A city record.
#[derive(Debug, Clone, PartialEq)]
pub struct City<'a> {
    pub country: u8,
    pub region: &'a [u8],
    pub city: &'a [u8],
    pub postal: &'a [u8],
    pub latitude: f64,
    pub longitude: f64,
    pub dma_code: u32,
    pub area_code: u32,
}

impl Db {
    /// Reads `data` as a database; `Err` names the edition when it is not one shard reads
    /// (nginx's `invalid GeoIP database ... type:N`).
    pub fn open(data: Vec<u8>) -> Result<Db, String> {
        let n = data.len();
        let mut edition_byte = None;
        // The structure info: three 0xFF bytes, the edition, then (city, org) the segments.
        for back in 3..=STRUCTURE_INFO_MAX.min(n) {
            let at = n - back;
            if data[at..at + 3] == [0xFF, 0xFF, 0xFF] {
                edition_byte = Some(at + 3);
                break;
            }
        }
        let Some(at) = edition_byte.filter(|&a| a < n) else {
            return Err("no GeoIP structure information".to_string());
        };
        let mut kind = data[at];
        if kind >= 106 {
            kind -= 105;
        }
        let segments_at = |d: &[u8]| -> Option<u32> {
            let s = d.get(at + 1..at + 4)?;
            Some(u32::from(s[0]) | u32::from(s[1]) << 8 | u32::from(s[2]) << 16)
        };
        let (edition, v6, record_len, segments) = match kind {
            1 => (Edition::Country, false, 3, COUNTRY_BEGIN),
            12 => (Edition::Country, true, 3, COUNTRY_BEGIN),
            2 | 6 | 30 | 31 => (
                Edition::City {
                    rev1: kind == 2 || kind == 30,
                },
                kind >= 30,
                3,
                segments_at(&data).ok_or("a truncated GeoIP city database")?,
            ),
            // ORG, ISP, ASNUM, DOMAIN (and their IPv6 editions): names.
            4 | 5 | 9 | 11 | 21 | 22 | 23 | 24 => (
                Edition::Org,
                kind >= 21,
                4,
                segments_at(&data).ok_or("a truncated GeoIP database")?,
            ),
            other => return Err(format!("type:{other}")),
        };
        Ok(Db {
            data,
            edition,
            v6,
            segments,
            record_len,
        })
    }

    /// The leaf the tree gives `addr` (v4-mapped for an IPv6 edition; a v4-mapped IPv6
    /// address as its IPv4 one for an IPv4 edition, a native one as 255.255.255.255).
    fn seek(&self, addr: IpAddr) -> Option<u32> {
        let key: Vec<u8> = match (self.v6, addr) {
            (true, IpAddr::V4(a)) => a.to_ipv6_mapped().octets().to_vec(),
            (true, IpAddr::V6(a)) => a.octets().to_vec(),
            (false, IpAddr::V4(a)) => a.octets().to_vec(),
            (false, IpAddr::V6(a)) => match a.to_ipv4_mapped() {
                Some(v4) => v4.octets().to_vec(),
                None => vec![255; 4],
            },
        };
        let bits = key.len() * 8;
        let rl = self.record_len;
        let mut offset: u32 = 0;
        for depth in (0..bits).rev() {
            let node = (offset as usize).checked_mul(2 * rl)?;
            let pair = self.data.get(node..node + 2 * rl)?;
            let bit = key[(bits - 1 - depth) / 8] >> (depth % 8) & 1;
            let rec = if bit == 1 { &pair[rl..] } else { &pair[..rl] };
            let x = rec
                .iter()
                .rev()
                .fold(0u32, |acc, &b| (acc << 8) | u32::from(b));
            if x >= self.segments {
                return Some(x);
            }
            offset = x;
        }
        None
    }

    /// A country database's country id for `addr`.
    pub fn country(&self, addr: IpAddr) -> Option<u8> {
        let x = self.seek(addr)?;
        u8::try_from(x - COUNTRY_BEGIN).ok()
    }

    /// Where a city or organization database keeps the record of leaf `x`.
    fn record_at(&self, x: u32) -> Option<&[u8]> {
        let at = (x as usize).checked_add((2 * self.record_len - 1) * self.segments as usize)?;
        self.data.get(at..)
    }

    /// A city database's record for `addr`.
    pub fn city(&self, addr: IpAddr) -> Option<City<'_>> {
        let x = self.seek(addr)?;
        if x == self.segments {
            return None;
        }
        let mut rest = self.record_at(x)?;
        let (&country, r) = rest.split_first()?;
        rest = r;
        let mut string = || -> Option<&[u8]> {
            let end = rest.iter().position(|&b| b == 0)?;
            let (s, r) = rest.split_at(end);
            rest = &r[1..];
            Some(s)
        };
        let (region, city, postal) = (string()?, string()?, string()?);
        let three = |b: &[u8]| u32::from(b[0]) | u32::from(b[1]) << 8 | u32::from(b[2]) << 16;
        let coords = rest.get(..6)?;
        let latitude = f64::from(three(&coords[..3])) / 10000.0 - 180.0;
        let longitude = f64::from(three(&coords[3..6])) / 10000.0 - 180.0;
        let (mut dma_code, mut area_code) = (0, 0);
        if matches!(self.edition, Edition::City { rev1: true }) && country_code(country) == b"US" {
            if let Some(c) = rest.get(6..9) {
                let combo = three(c);
                dma_code = combo / 1000;
                area_code = combo % 1000;
            }
        }
        Some(City {
            country,
            region,
            city,
            postal,
            latitude,
            longitude,
            dma_code,
            area_code,
        })
    }

    /// An organization database's name for `addr`.
    pub fn org(&self, addr: IpAddr) -> Option<&[u8]> {
        let x = self.seek(addr)?;
        if x == self.segments {
            return None;
        }
        let rest = self.record_at(x)?;
        let end = rest.iter().position(|&b| b == 0)?;
        Some(&rest[..end])
    }
}

/// A country id's two-letter code (`--` for none).
pub fn country_code(id: u8) -> &'static [u8] {
    crate::geoip_data::COUNTRIES[usize::from(id)].0
}

/// A country id's three-letter code.
pub fn country_code3(id: u8) -> &'static [u8] {
    crate::geoip_data::COUNTRIES[usize::from(id)].1
}

/// A country id's continent code.
pub fn continent(id: u8) -> &'static [u8] {
    crate::geoip_data::COUNTRIES[usize::from(id)].2
}

/// A country id's name.
pub fn country_name(id: u8) -> &'static [u8] {
    crate::geoip_data::COUNTRIES[usize::from(id)].3
}

/// The name of region `region` of the country with code `country`.
pub fn region_name(country: &[u8], region: &[u8]) -> Option<&'static [u8]> {
    let r = &crate::geoip_data::REGIONS;
    r.binary_search_by(|(c, rc, _)| (*c, *rc).cmp(&(country, region)))
        .ok()
        .map(|i| r[i].2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A three-byte little-endian record.
    fn node(v: u32) -> [u8; 3] {
        [v as u8, (v >> 8) as u8, (v >> 16) as u8]
    }

    /// An IPv4 country database where 10.0.0.1 is RU and everything else is unknown.
    fn country_db() -> Vec<u8> {
        let ip = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 1));
        let mut d = Vec::new();
        for depth in (0..32).rev() {
            let i = 31 - depth;
            let bit = ip >> depth & 1;
            let next = if depth == 0 {
                COUNTRY_BEGIN + 185
            } else {
                i as u32 + 1
            };
            let (l, r) = if bit == 1 {
                (COUNTRY_BEGIN, next)
            } else {
                (next, COUNTRY_BEGIN)
            };
            d.extend_from_slice(&node(l));
            d.extend_from_slice(&node(r));
        }
        d.extend_from_slice(&[0, 0, 0, 0xFF, 0xFF, 0xFF, 1]);
        d
    }

    #[test]
    fn a_country_database_names_an_address() {
        let db = Db::open(country_db()).unwrap();
        assert_eq!(db.edition, Edition::Country);
        let ru = db.country("10.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(
            (country_code(ru), country_code3(ru), country_name(ru)),
            (&b"RU"[..], &b"RUS"[..], &b"Russian Federation"[..])
        );
        assert_eq!(continent(ru), b"EU");
        assert_eq!(db.country("10.0.0.2".parse().unwrap()), Some(0));
        // A v4-mapped IPv6 address is its IPv4 one.
        assert_eq!(db.country("::ffff:10.0.0.1".parse().unwrap()), Some(185));
        assert_eq!(region_name(b"RU", b"48"), Some(&b"Moscow City"[..]));
        assert_eq!(region_name(b"RU", b"ZZ"), None);
        assert!(Db::open(vec![1, 2, 3]).is_err());
        assert_eq!(
            Db::open(vec![0, 0, 0, 0xFF, 0xFF, 0xFF, 99]).unwrap_err(),
            "type:99"
        );
    }
}

//! nginx's `autoindex`: a directory's listing as HTML (nginx's page, byte for byte), JSON or
//! XML. The caller reads the directory and each entry's metadata; this module sorts the entries
//! (directories first, then by name, bytewise) and writes the body. No I/O.

use std::fmt::Write as _;

/// One directory entry, as the listing shows it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The name's bytes (not necessarily UTF-8).
    pub name: Vec<u8>,
    pub dir: bool,
    /// A regular file (else `other` in JSON and XML when it is not a directory either).
    pub file: bool,
    pub size: u64,
    /// Modification time, unix seconds.
    pub mtime: i64,
}

/// `autoindex_format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Html,
    Json,
    Xml,
}

/// The longest name the HTML listing shows whole (nginx's `NGX_HTTP_AUTOINDEX_NAME_LEN`).
const NAME_LEN: usize = 50;

/// nginx's order: directories first, then the names compared bytewise.
pub fn sort(entries: &mut [Entry]) {
    entries.sort_by(|a, b| b.dir.cmp(&a.dir).then_with(|| a.name.cmp(&b.name)));
}

/// nginx's `NGX_ESCAPE_URI_COMPONENT`: letters, digits and `-._~` are kept, every other byte
/// is escaped.
fn escape_component(name: &[u8], out: &mut String) {
    crate::static_file::percent_escape(name, out, |b| {
        b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
    });
}

/// nginx's `ngx_escape_html`: `<`, `>`, `&` and `"`.
fn escape_html(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
}

/// (year, month 1-12, day, hour, minute, second) of unix seconds, UTC (before 1970: 1970).
fn civil(t: i64) -> (i64, usize, u32, u32, u32, u32) {
    let c = crate::civil(t.max(0) as u64);
    (c.year, c.month, c.day, c.hour, c.min, c.sec)
}

/// `directory`, `file` or `other`, as the JSON and XML listings name an entry.
fn kind(e: &Entry) -> &'static str {
    if e.dir {
        "directory"
    } else if e.file {
        "file"
    } else {
        "other"
    }
}

/// The listing of `entries` (sorted by [`sort`]) for the directory `uri` (as requested,
/// decoded). `utf8`: the response's charset is UTF-8, so names are cut by characters.
pub fn render(
    format: Format,
    uri: &str,
    entries: &[Entry],
    utf8: bool,
    exact_size: bool,
) -> String {
    match format {
        Format::Html => html(uri, entries, utf8, exact_size),
        Format::Json => json(entries),
        Format::Xml => xml(entries),
    }
}

fn html(uri: &str, entries: &[Entry], utf8: bool, exact_size: bool) -> String {
    let mut s = String::with_capacity(256 + entries.len() * 120);
    s.push_str("<html>\r\n<head><title>Index of ");
    escape_html(uri, &mut s);
    s.push_str("</title></head>\r\n<body>\r\n<h1>Index of ");
    escape_html(uri, &mut s);
    s.push_str("</h1><hr><pre><a href=\"../\">../</a>\r\n");
    for e in entries {
        s.push_str("<a href=\"");
        escape_component(&e.name, &mut s);
        if e.dir {
            s.push('/');
        }
        s.push_str("\">");
        let name = String::from_utf8_lossy(&e.name);
        // The shown length: characters under a UTF-8 charset, else bytes.
        let chars: Vec<char> = name.chars().collect();
        let mut len = if utf8 { chars.len() } else { e.name.len() };
        let shown: String = if len > NAME_LEN {
            if utf8 {
                chars[..NAME_LEN - 3].iter().collect()
            } else {
                String::from_utf8_lossy(&e.name[..NAME_LEN - 3]).into_owned()
            }
        } else {
            name.into_owned()
        };
        escape_html(&shown, &mut s);
        if len > NAME_LEN {
            s.push_str("..&gt;</a>");
        } else {
            if e.dir && NAME_LEN > len {
                s.push('/');
                len += 1;
            }
            s.push_str("</a>");
            s.extend(std::iter::repeat_n(' ', NAME_LEN - len));
        }
        let (y, m, d, hh, mm, _) = civil(e.mtime);
        let _ = write!(s, " {d:02}-{}-{y} {hh:02}:{mm:02} ", crate::MONTHS[m - 1]);
        if exact_size {
            if e.dir {
                s.push_str("                  -");
            } else {
                let _ = write!(s, "{:>19}", e.size);
            }
        } else if e.dir {
            s.push_str("      -");
        } else {
            let (n, scale) = human_size(e.size);
            match scale {
                Some(c) => {
                    let _ = write!(s, "{n:>6}{c}");
                }
                None => {
                    let _ = write!(s, " {n:>6}");
                }
            }
        }
        s.push_str("\r\n");
    }
    s.push_str("</pre><hr></body>\r\n</html>\r\n");
    s
}

/// nginx's rounded sizes of `autoindex_exact_size off`.
fn human_size(len: u64) -> (u64, Option<char>) {
    const G: u64 = 1 << 30;
    const M: u64 = 1 << 20;
    if len > G - 1 {
        (len / G + u64::from(len % G > G / 2 - 1), Some('G'))
    } else if len > M - 1 {
        (len / M + u64::from(len % M > M / 2 - 1), Some('M'))
    } else if len > 9999 {
        (len / 1024 + u64::from(len % 1024 > 511), Some('K'))
    } else {
        (len, None)
    }
}

fn http_time(t: i64) -> String {
    crate::http_date(t.max(0) as u64)
}

fn json(entries: &[Entry]) -> String {
    let mut s = String::from("[");
    for (i, e) in entries.iter().enumerate() {
        s.push_str("\r\n{ \"name\":\"");
        for c in String::from_utf8_lossy(&e.name).chars() {
            match c {
                '"' => s.push_str("\\\""),
                '\\' => s.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(s, "\\u{:04x}", c as u32);
                }
                c => s.push(c),
            }
        }
        let kind = if e.dir {
            "directory"
        } else if e.file {
            "file"
        } else {
            "other"
        };
        let _ = write!(
            s,
            "\", \"type\":\"{kind}\", \"mtime\":\"{}",
            http_time(e.mtime)
        );
        if e.file {
            let _ = write!(s, "\", \"size\":{}", e.size);
        } else {
            s.push('"');
        }
        s.push_str(" }");
        if i + 1 < entries.len() {
            s.push(',');
        }
    }
    s.push_str("\r\n]");
    s
}

fn xml(entries: &[Entry]) -> String {
    let mut s = String::from("<?xml version=\"1.0\"?>\r\n<list>\r\n");
    for e in entries {
        let kind = kind(e);
        let (y, m, d, hh, mm, ss) = civil(e.mtime);
        let _ = write!(
            s,
            "<{kind} mtime=\"{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z\""
        );
        if e.file {
            let _ = write!(s, " size=\"{}\"", e.size);
        }
        s.push('>');
        escape_html(&String::from_utf8_lossy(&e.name), &mut s);
        let _ = write!(s, "</{kind}>\r\n");
    }
    s.push_str("</list>\r\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(name: &str, dir: bool, size: u64) -> Entry {
        Entry {
            name: name.as_bytes().to_vec(),
            dir,
            file: !dir,
            size,
            mtime: 1_795_521_600, // 2026-11-24 12:00:00
        }
    }

    #[test]
    fn nginx_html_listing() {
        let mut v = vec![
            e("b.txt", false, 12),
            e("a dir", true, 0),
            e("a:b?", false, 0),
        ];
        sort(&mut v);
        let h = html("/x/", &v, false, true);
        let want = "<html>\r\n<head><title>Index of /x/</title></head>\r\n<body>\r\n\
<h1>Index of /x/</h1><hr><pre><a href=\"../\">../</a>\r\n\
<a href=\"a%20dir/\">a dir/</a>                                             24-Nov-2026 12:00                   -\r\n\
<a href=\"a%3Ab%3F\">a:b?</a>                                               24-Nov-2026 12:00                   0\r\n\
<a href=\"b.txt\">b.txt</a>                                              24-Nov-2026 12:00                  12\r\n\
</pre><hr></body>\r\n</html>\r\n";
        assert_eq!(h, want);
        let long = [e(&format!("long-{}", ">".repeat(50)), false, 1)];
        let h = html("/", &long, false, true);
        assert!(
            h.contains(&format!("long-{}..&gt;</a>", "&gt;".repeat(42))),
            "{h}"
        );
        let utf = [e(&"ф".repeat(3), false, 1)];
        assert!(html("/", &utf, true, true).contains(">ффф</a>"));
        assert_eq!(human_size(10_000), (10, Some('K')));
        assert_eq!(human_size(9_999), (9_999, None));
    }

    #[test]
    fn json_and_xml_listings() {
        let v = vec![e("d", true, 0), e("f\"", false, 3)];
        assert_eq!(
            json(&v),
            "[\r\n{ \"name\":\"d\", \"type\":\"directory\", \"mtime\":\"Tue, 24 Nov 2026 12:00:00 GMT\" },\
\r\n{ \"name\":\"f\\\"\", \"type\":\"file\", \"mtime\":\"Tue, 24 Nov 2026 12:00:00 GMT\", \"size\":3 }\r\n]"
        );
        assert_eq!(
            xml(&v),
            "<?xml version=\"1.0\"?>\r\n<list>\r\n<directory mtime=\"2026-11-24T12:00:00Z\">d</directory>\r\n\
<file mtime=\"2026-11-24T12:00:00Z\" size=\"3\">f&quot;</file>\r\n</list>\r\n"
        );
    }
}
